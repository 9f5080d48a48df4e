#!/usr/bin/env bash
# Build kube-apiserver and kube-controller-manager (v1.20.2) from Debian bookworm's `kubernetes`
# source package into OUT/bin (default: .cache/kube). No registry ships these binaries; Debian's
# source package holds the upstream tree with every Go dependency vendored, so the build is offline
# once the source is downloaded. Used by `make kube`; tests/k8s/kube/apiserver.py starts the result.
#
# Usage: tests/k8s/kube/build.sh [OUT]
set -euo pipefail

OUT=$(realpath -m "${1:-.cache/kube}")
WANT=(kube-apiserver kube-controller-manager)
if [ -x "$OUT/bin/kube-apiserver" ] && [ -x "$OUT/bin/kube-controller-manager" ]; then
    echo "kube: $OUT/bin already holds ${WANT[*]}"
    exit 0
fi
mkdir -p "$OUT"
started=$(date +%s)

# Debian's Go toolchain, the reflect2 release that works under Go >= 1.18, and rsync (Kubernetes'
# codegen step copies trees with it). sudo only when not root, like the Makefile's kcat target.
need=()
command -v go >/dev/null || need+=(golang-go)
[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need+=(golang-github-modern-go-reflect2-dev)
command -v rsync >/dev/null || need+=(rsync)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    echo "kube: installing ${need[*]}"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${need[@]}"
fi

# A private apt directory whose sources list holds deb-src lines derived from the machine's own
# Debian sources (deb822 or one-line format). The machine's apt configuration is not changed.
APT="$OUT/apt"
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/src"
python3 - "$APT/sources.list" <<'PY'
import pathlib
import sys

lines: list[str] = []
deb822 = pathlib.Path("/etc/apt/sources.list.d/debian.sources")
if deb822.exists():
    for stanza in deb822.read_text().split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        signed = f"[signed-by={fields['signed-by']}] " if "signed-by" in fields else ""
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                lines.append(f"deb-src {signed}{uri} {suite} {fields.get('components', 'main')}")
for path in [pathlib.Path("/etc/apt/sources.list"), *pathlib.Path("/etc/apt/sources.list.d").glob("*.list")]:
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip().startswith("deb "):
                lines.append("deb-src " + line.strip()[4:])
if not lines:
    sys.exit("kube: no Debian 'deb' sources found in /etc/apt to derive deb-src lines from")
pathlib.Path(sys.argv[1]).write_text("\n".join(dict.fromkeys(lines)) + "\n")
PY
APT_OPTS=(-o "Dir::Etc::sourcelist=$APT/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache")
SRC="$APT/src"
if ! ls "$SRC"/kubernetes_*.orig.tar.* >/dev/null 2>&1; then
    echo "kube: downloading Debian's kubernetes source package"
    apt-get "${APT_OPTS[@]}" update -qq
    (cd "$SRC" && apt-get "${APT_OPTS[@]}" source --download-only kubernetes)
fi
ORIG=$(ls "$SRC"/kubernetes_*.orig.tar.* | head -n 1)
echo "kube: source $(basename "$ORIG")"

# The upstream tree, placed where Kubernetes' GOPATH-mode build expects it.
GOPATH_DIR="$OUT/gopath"
TREE="$OUT/kubernetes"
if [ ! -f "$TREE/cmd/kube-apiserver/apiserver.go" ]; then
    rm -rf "$TREE" && mkdir -p "$TREE"
    tar -xf "$ORIG" -C "$TREE" --strip-components=1
fi
mkdir -p "$GOPATH_DIR/src/k8s.io"
ln -sfn "$TREE" "$GOPATH_DIR/src/k8s.io/kubernetes"

# The vendored modern-go/reflect2 1.0.1 crashes at start-up under Go >= 1.18 (it reads runtime
# internals that moved); Debian's 1.0.2 has the fix.
rsync -a --delete --exclude '*_test.go' \
    /usr/share/gocode/src/github.com/modern-go/reflect2/ "$TREE/vendor/github.com/modern-go/reflect2/"

# Kubernetes' own make runs the code generators (openapi etc.) a plain `go build` lacks.
# HOME, GOPATH and GOCACHE stay inside OUT so nothing outside it is written.
echo "kube: building ${WANT[*]} (several minutes)"
(cd "$GOPATH_DIR/src/k8s.io/kubernetes" \
    && env HOME="$OUT/home" GOPATH="$GOPATH_DIR" GOCACHE="$OUT/gocache" GOFLAGS= GO111MODULE=off \
        make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" GOLDFLAGS="-s -w")
mkdir -p "$OUT/bin"
for binary in "${WANT[@]}"; do
    install -m 0755 "$TREE/_output/bin/$binary" "$OUT/bin/$binary"
done
echo "kube: built in $(( $(date +%s) - started )) s:"
ls -l "$OUT/bin"
# The build tree is 2.2 GB; the downloaded source (OUT/apt/src) stays for a rebuild.
rm -rf "$TREE" "$GOPATH_DIR" "$OUT/home" "$OUT/gocache"
