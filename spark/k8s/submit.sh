#!/usr/bin/env bash
# Submit one of Fjord's Spark jobs to Kubernetes with plain spark-submit (cluster mode), without
# the Spark operator (for that, `kubectl apply -f spark/k8s/sparkapplication-<job>.yaml`).
#
# Usage: spark/k8s/submit.sh JOB [extra job arguments...]
#   JOB: orders-shipments | log-analysis | risk-control
#   extra arguments go to the job after the defaults (e.g. --available-now, --max-amount 5000).
#
# Environment (defaults in brackets; they match spark/fjord_jobs/defaults.py):
#   K8S_API_SERVER         API server URL, e.g. https://10.0.0.1:6443 [from `kubectl config`]
#   NAMESPACE              namespace of the driver and executors [fjord]
#   SPARK_IMAGE            image with Spark and fjord_jobs [fjord/spark:0.1.0]
#   SERVICE_ACCOUNT        driver's service account [fjord-spark]
#   BOOTSTRAP_SERVERS      Fjord brokers as seen from the pods [fjord-broker.fjord.svc:9092]
#   FJORD_USER             the job's FjordUser Secret (spark/k8s/fjorduser-JOB.yaml), mounted at
#                          /etc/fjord-user in the driver and executors; the job gets
#                          --command-config /etc/fjord-user/client.properties [fjord-JOB];
#                          FJORD_USER= (empty) for a plaintext cluster without ACLs
#   DATA_DIR               shared volume's mount point in the pods [/var/lib/fjord-spark]
#   EXECUTORS              executor count [2]
#   SPARK_SUBMIT           the spark-submit to run [spark-submit]
#   DRY_RUN=1              print the command (one argument per line) instead of running it
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
    sed -n '5,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
job="$1"
shift

case "$job" in
    orders-shipments | log-analysis | risk-control) ;;
    *)
        echo "error: unknown job '$job' (orders-shipments, log-analysis or risk-control)" >&2
        exit 2
        ;;
esac

namespace="${NAMESPACE:-fjord}"
image="${SPARK_IMAGE:-fjord/spark:0.1.0}"
service_account="${SERVICE_ACCOUNT:-fjord-spark}"
bootstrap="${BOOTSTRAP_SERVERS:-fjord-broker.fjord.svc:9092}"
data_dir="${DATA_DIR:-/var/lib/fjord-spark}"
executors="${EXECUTORS:-2}"
user_secret="${FJORD_USER-fjord-$job}"
user_mount=/etc/fjord-user
spark_submit="${SPARK_SUBMIT:-spark-submit}"

if [[ -z "${K8S_API_SERVER:-}" ]]; then
    if command -v kubectl >/dev/null; then
        K8S_API_SERVER="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
    fi
fi
if [[ -z "${K8S_API_SERVER:-}" ]]; then
    echo "error: set K8S_API_SERVER (e.g. https://10.0.0.1:6443) or configure kubectl" >&2
    exit 2
fi

module="${job//-/_}"
job_args=(--bootstrap-servers "$bootstrap")
secret_confs=()
if [[ -n "$user_secret" ]]; then
    # Spark mounts a Secret in the driver and in every executor (the executors' clients open the
    # certificate files themselves): spark.kubernetes.{driver,executor}.secrets.NAME=PATH.
    secret_confs=(
        --conf "spark.kubernetes.driver.secrets.$user_secret=$user_mount"
        --conf "spark.kubernetes.executor.secrets.$user_secret=$user_mount"
    )
    job_args+=(--command-config "$user_mount/client.properties")
fi
job_args+=(--checkpoint "$data_dir/checkpoints/$job")
if [[ "$job" == log-analysis ]]; then
    job_args+=(--parquet-dir "$data_dir/log-counts")
fi

command=(
    "$spark_submit"
    --master "k8s://$K8S_API_SERVER"
    --deploy-mode cluster
    --name "fjord-$job"
    --conf "spark.kubernetes.namespace=$namespace"
    --conf "spark.kubernetes.container.image=$image"
    --conf "spark.kubernetes.container.image.pullPolicy=IfNotPresent"
    --conf "spark.kubernetes.authenticate.driver.serviceAccountName=$service_account"
    --conf "spark.kubernetes.driver.podTemplateFile=$here/driver-pod-template.yaml"
    --conf "spark.kubernetes.driver.podTemplateContainerName=spark-kubernetes-driver"
    --conf "spark.kubernetes.executor.podTemplateFile=$here/executor-pod-template.yaml"
    --conf "spark.kubernetes.executor.podTemplateContainerName=spark-kubernetes-executor"
    --conf "spark.executor.instances=$executors"
    --conf "spark.sql.session.timeZone=UTC"
    ${secret_confs[@]+"${secret_confs[@]}"}
    "local:///opt/fjord/spark/fjord_jobs/$module.py"
    "${job_args[@]}"
    "$@"
)

if [[ "${DRY_RUN:-}" == 1 ]]; then
    printf '%s\n' "${command[@]}"
else
    exec "${command[@]}"
fi
