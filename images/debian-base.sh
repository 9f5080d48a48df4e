#!/usr/bin/env bash
# A local stand-in for python:3.11-slim-bookworm, for machines that cannot pull official images:
# Debian bookworm (debootstrap, minbase) from the Debian archive this machine's apt already uses,
# with Debian's python3.11 and a virtual environment at /usr/local, so that, as in the official
# image, `python` and `pip` are /usr/local/bin/python and /usr/local/bin/pip and `pip install`
# puts packages and console scripts under /usr/local (Debian's own python3 is "externally
# managed" and refuses pip installs).
#
# Usage: images/debian-base.sh IMAGE_NAME CACHE_DIR
# The root filesystem tarball is cached in CACHE_DIR (reused while it exists).
set -euo pipefail

image=${1:?usage: debian-base.sh IMAGE_NAME CACHE_DIR}
cache=${2:?usage: debian-base.sh IMAGE_NAME CACHE_DIR}
suite=bookworm
here=$(cd "$(dirname "$0")" && pwd)
tarball="$cache/debian-$suite-python.tar"

if [ ! -s "$tarball" ]; then
    mirror=$("$here/apt-mirror.sh" "$suite")
    echo "debian-base: debootstrap $suite from $mirror (the mirror of this machine's apt sources)"
    root="$cache/rootfs"
    rm -rf "$root" && mkdir -p "$root"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$suite" "$root" "$mirror"
    # The official image's layout: python and pip in /usr/local/bin, installs under /usr/local.
    # (Debian's bundled pip, 23.0.1: the image's pip is only used to install the wheel.)
    chroot "$root" /usr/bin/python3 -m venv /usr/local
    chroot "$root" /usr/local/bin/python -c 'import sys; assert sys.version_info[:2] == (3, 11)'
    # What the official slim image leaves out too: apt's package lists and downloaded .debs.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb \
           "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* "$root"/usr/share/man/*
    tar -C "$root" --numeric-owner -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    rm -rf "$root"
fi

container=$(buildah from scratch)
trap 'buildah rm "$container" >/dev/null' EXIT
buildah add --quiet "$container" "$tarball" /
buildah config --env LANG=C.UTF-8 --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd python --label "org.opencontainers.image.description=Debian $suite (debootstrap) with python3.11 in /usr/local, stand-in for python:3.11-slim-$suite" \
    "$container"
buildah commit --quiet --rm "$container" "$image" >/dev/null
trap - EXIT
echo "debian-base: $image"
