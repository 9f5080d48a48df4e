#!/bin/sh
# Stand-in for apache/spark's /opt/decom.sh (executor decommissioning on Kubernetes): nothing to
# decommission where the stand-in entrypoint refuses executor mode.
echo "decom.sh: stand-in (images/spark-standin); no executor to decommission" >&2
exit 0
