#!/usr/bin/env bash
# Builds one of the project's images with buildah, without a Docker engine:
#   images/build.sh fjord   ->  fjord/fjord:0.1.0 from ./Dockerfile
#   images/build.sh spark   ->  fjord/spark:0.1.0 from ./spark/Dockerfile
# The Dockerfiles are the ones users build with `docker build`; nothing in them changes here.
# Where an official base image cannot be pulled, its build argument is pointed at a local
# stand-in (docs/kubernetes.md, "Images built here"):
#   PYTHON_IMAGE  python:3.11-slim-bookworm  ->  Debian bookworm from debootstrap with Debian's
#                                               python3.11 in /usr/local (images/debian-base.sh)
#   SPARK_IMAGE   apache/spark:4.0.0         ->  images/spark-standin/ (only its entrypoint.sh and
#                                               decom.sh are copied; the stand-ins run commands
#                                               but refuse Spark's driver/executor modes)
# Environment: IMAGE_CACHE (default build/images) holds the debootstrap tarball and build logs.
set -euo pipefail

what=${1:?usage: images/build.sh fjord|spark}
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${IMAGE_CACHE:-$root/build/images}
mkdir -p "$cache"
cd "$root"

local_python=localhost/fjord-base/python:3.11-slim-bookworm
local_spark=localhost/fjord-base/spark-entrypoint:standin

# The official image when this machine can pull it, else the stand-in (built once).
pullable() {
    timeout 120 buildah pull --quiet "$1" >/dev/null 2>&1
}
args=()
if pullable docker.io/library/python:3.11-slim-bookworm; then
    echo "build: base python:3.11-slim-bookworm (official)"
else
    buildah inspect --type image "$local_python" >/dev/null 2>&1 \
        || "$root/images/debian-base.sh" "$local_python" "$cache"
    echo "build: base $local_python (official python:3.11-slim-bookworm cannot be pulled here)"
    args+=(--build-arg "PYTHON_IMAGE=$local_python")
fi

case $what in
    fjord) dockerfile=Dockerfile; tag=fjord/fjord:0.1.0 ;;
    spark)
        dockerfile=spark/Dockerfile; tag=fjord/spark:0.1.0
        if pullable docker.io/apache/spark:4.0.0; then
            echo "build: Spark entrypoint from apache/spark:4.0.0 (official)"
        else
            buildah inspect --type image "$local_spark" >/dev/null 2>&1 \
                || buildah bud --quiet --isolation chroot -t "$local_spark" images/spark-standin >/dev/null
            echo "build: Spark entrypoint from $local_spark (apache/spark:4.0.0 cannot be pulled here)"
            args+=(--build-arg "SPARK_IMAGE=$local_spark")
        fi
        ;;
    *) echo "usage: images/build.sh fjord|spark" >&2; exit 2 ;;
esac

# Where pip on this machine needs its own CA bundle (PIP_CERT: a TLS-intercepting proxy), the
# build's RUN steps see it in place of the bundles pip and the system trust: bind mounts over
# files the image already has, so nothing of it stays in the image.
if [ -n "${PIP_CERT:-}" ] && [ -s "$PIP_CERT" ]; then
    for target in /etc/ssl/certs/ca-certificates.crt \
                  /usr/local/lib/python3.11/site-packages/pip/_vendor/certifi/cacert.pem; do
        args+=(--volume "$PIP_CERT:$target:ro")
    done
fi

previous=$(buildah images --quiet --no-trunc "$tag" 2>/dev/null || true)
containers_before=$(buildah containers --quiet --notruncate | sort)
start=$(date +%s)
# No --layers: buildah 1.28 (bookworm) then finds a cached stage's files missing for
# `RUN --mount=type=bind,from=builder` ("couldn't find .../merged/wheels"), so every build
# starts afresh.
buildah bud --isolation chroot -f "$dockerfile" -t "$tag" "${args[@]}" . \
    >"$cache/$what-build.log" 2>&1 \
    || { tail -30 "$cache/$what-build.log"; echo "build: $tag failed (log: $cache/$what-build.log)"; exit 1; }
echo "build: $tag in $(( $(date +%s) - start )) s (log: $cache/$what-build.log)"
# buildah 1.28 leaves the working container of a stage that is only a `COPY --from` source
# (spark-official) behind, mounted: remove the containers this build created.
comm -13 <(echo "$containers_before") <(buildah containers --quiet --notruncate | sort) \
    | xargs -r buildah rm >/dev/null
# The image this build replaced, now untagged, would only take disk space.
current=$(buildah images --quiet --no-trunc "$tag")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    buildah rmi "$previous" >/dev/null 2>&1 || true
fi
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$tag"
