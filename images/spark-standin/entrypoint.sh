#!/bin/sh
# Stand-in for apache/spark's /opt/entrypoint.sh in a locally built fjord/spark image
# (images/build.sh): runs its arguments; Spark-on-Kubernetes modes need the official one.
case "$1" in
    driver|executor)
        echo "entrypoint.sh: this image was built with a stand-in for apache/spark's entrypoint" \
             "(images/spark-standin); '$1' needs the official one: rebuild where apache/spark" \
             "can be pulled" >&2
        exit 64 ;;
esac
exec "$@"
