#!/usr/bin/env bash
# Prints the Debian archive URL this machine's apt uses for SUITE (deb822 .sources files or the
# one-line sources.list format), so that debootstrap reads the same archive as apt does.
set -euo pipefail
suite=${1:?usage: apt-mirror.sh SUITE}
python3 - "$suite" <<'PY'
import glob, re, sys

suite = sys.argv[1]
found = []
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in open(path).read().split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if line.strip().startswith("#") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.split()
        if ("deb" in fields.get("types", []) and suite in fields.get("suites", [])
                and "main" in fields.get("components", [])
                and fields.get("enabled", ["yes"])[0] != "no"):
            found += fields.get("uris", [])
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        words = re.sub(r"\[[^\]]*\]", " ", line.split("#")[0]).split()  # drop [options]
        if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
            found.append(words[1])
if not found:
    sys.exit(f"apt-mirror: no 'deb' source for {suite} main in /etc/apt/sources*")
print(found[0])
PY
