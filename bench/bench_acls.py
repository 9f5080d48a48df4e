"""ACL authorizer benchmark: the cost of one ``Authorizer.authorize`` decision (the check every
Produce/Fetch topic and every group request makes with authorization on) as the number of ACLs
grows, and the cost of building the authorizer (done once per ACL change).

Each ACL set has N bindings on topics ``t<i>`` (a third prefixed, the rest literal) for 50
principals, plus one wildcard ``*`` Deny of another principal; the decision asked is Read on a
topic whose literal and prefix ACLs exist. Pure Python, no processes.

Usage: .venv/bin/python bench/bench_acls.py [--sizes 10,1000,10000] [--checks 20000]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_file import cpu_model

from fjord.security import Principal
from fjord.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    Authorizer,
    PatternType,
    Resource,
    ResourcePattern,
    ResourceType,
)


def acl_set(size: int) -> list[AclBinding]:
    out = [
        AclBinding(
            ResourcePattern(ResourceType.TOPIC, f"t{i}",
                            PatternType.PREFIXED if i % 3 == 0 else PatternType.LITERAL),
            AccessControlEntry(f"User:u{i % 50}", "*", AclOperation.READ, AclPermissionType.ALLOW),
        )
        for i in range(size)
    ]
    out.append(AclBinding(ResourcePattern(ResourceType.TOPIC, "*"), AccessControlEntry(
        "User:intruder", "*", AclOperation.ALL, AclPermissionType.DENY)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--checks", type=int, default=20000)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| ACLs | build ms | decision us (median of 5) | allowed |")
    print("|---:|---:|---:|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        bindings = acl_set(size)
        start = time.perf_counter()
        authorizer = Authorizer(bindings)
        build_ms = (time.perf_counter() - start) * 1000
        principal, resource = Principal("u3"), Resource.topic("t3")
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(args.checks):
                allowed = authorizer.authorize(principal, "10.0.0.1", AclOperation.READ, resource)
            rounds.append((time.perf_counter() - start) / args.checks * 1e6)
        print(f"| {size:,} | {build_ms:.1f} | {sorted(rounds)[2]:.1f} | {allowed} |")


if __name__ == "__main__":
    main()
