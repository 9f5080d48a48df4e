"""Every default of Fjord's Spark jobs, defined once (docs/spark-jobs.md lists them).

Command-line flags of the jobs default to these values; tests and the Kubernetes manifests in
``spark/k8s/`` refer to the same names.
"""

from __future__ import annotations

# --- shared by every job ---

#: Where the jobs find the cluster when ``--bootstrap-servers`` is not given (what
#: ``fjord local up`` prints for a one-machine cluster is usually different: pass it).
DEFAULT_BOOTSTRAP_SERVERS = "localhost:9092"
#: Spark master used when neither ``spark-submit`` nor the environment chose one.
DEFAULT_LOCAL_MASTER = "local[*]"
#: Micro-batch interval of a continuously running job (ignored with ``--available-now``).
DEFAULT_TRIGGER_INTERVAL = "10 seconds"
#: Where a job starts reading a topic the first time (later runs resume from the checkpoint).
DEFAULT_STARTING_OFFSETS = "earliest"
#: Cap on records read per micro-batch over all partitions (Spark's ``maxOffsetsPerTrigger``), so
#: a job that starts far behind catches up in bounded steps instead of one huge batch.
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 100_000
#: Header on every dead-lettered record naming why it was rejected (value: an error code).
REJECT_REASON_HEADER = "fjord.reject.reason"

# --- orders -> shipments (seed 000, scenario 1) ---

DEFAULT_ORDERS_TOPIC = "orders"
DEFAULT_SHIPMENTS_TOPIC = "shipments"
#: Orders that cannot become shipments (malformed JSON, missing fields, unknown sku) go here,
#: byte for byte, with a reason header: nothing is dropped silently.
DEFAULT_ORDERS_DEAD_LETTER_TOPIC = "orders.dlq"

# --- log collection and analysis (scenario 2) ---

DEFAULT_LOGS_TOPIC = "logs"
DEFAULT_LOG_COUNTS_TOPIC = "log-counts"
DEFAULT_LOGS_DEAD_LETTER_TOPIC = "logs.dlq"
#: Tumbling window of the counts per service and level.
DEFAULT_LOG_WINDOW = "1 minute"
#: How late a log line may arrive and still be counted in its window.
DEFAULT_LOG_WATERMARK = "2 minutes"

# --- risk control (scenario 3) ---

DEFAULT_TRANSACTIONS_TOPIC = "transactions"
DEFAULT_RISK_ALERTS_TOPIC = "risk-alerts"
DEFAULT_TRANSACTIONS_DEAD_LETTER_TOPIC = "transactions.dlq"
#: Length of the sliding velocity window (N minutes) ...
DEFAULT_VELOCITY_WINDOW = "10 minutes"
#: ... and how often a new window starts (M minutes).
DEFAULT_VELOCITY_SLIDE = "1 minute"
#: How late a transaction may arrive and still be counted.
DEFAULT_VELOCITY_WATERMARK = "5 minutes"
#: Alert when a user makes more than this many transactions in one window ...
DEFAULT_MAX_TRANSACTIONS_PER_WINDOW = 5
#: ... or spends more than this amount in one window.
DEFAULT_MAX_AMOUNT_PER_WINDOW = 10_000.0

# --- Spark on Kubernetes (spark/k8s/; tests check the manifests against these) ---

#: The project's Spark image: Spark + this venv's Python packages (fjord, fjord_spark, fjord_jobs),
#: the jobs' sources under SPARK_JOBS_DIR_IN_IMAGE (built from spark/Dockerfile).
SPARK_IMAGE = "fjord/spark:0.1.0"
#: Spark release of the image (and of the pyspark the project pins).
SPARK_VERSION = "4.3.0"
#: Service account of driver pods (it creates and deletes executor pods); the Helm chart makes it.
SPARK_SERVICE_ACCOUNT = "fjord-spark"
#: Namespace of the jobs (the Fjord cluster's).
SPARK_NAMESPACE = "fjord"
#: Where the image keeps the jobs' files, the mainApplicationFile of each submission.
SPARK_JOBS_DIR_IN_IMAGE = "/opt/fjord/spark/fjord_jobs"
#: Bootstrap servers of the in-cluster Fjord brokers (the brokers' Service).
K8S_BOOTSTRAP_SERVERS = "fjord-broker.fjord.svc:9092"
#: Shared volume (ReadWriteMany PVC) for checkpoints and Parquet output, mounted in driver and
#: executors: a streaming checkpoint must outlive the driver pod.
SPARK_DATA_CLAIM = "fjord-spark-data"
SPARK_DATA_MOUNT = "/var/lib/fjord-spark"

# --- the jobs' credentials on a secure cluster (TLS + ACLs, the chart's default) ---

#: The FjordUser of each job (spark/k8s/fjorduser-<job>.yaml) is named like its SparkApplication,
#: ``fjord-<job>``; the operator writes that user's Secret under the same name (ca.crt,
#: user.crt, user.key, client.properties) and its principal is ``User:fjord-<job>``.
SPARK_USER_PREFIX = "fjord-"
#: Where driver and executors mount the job's user Secret: the directory the paths inside its
#: ``client.properties`` point to (the operator's USER_SECRET_MOUNT_DIR; executors open the
#: certificate files themselves, so they mount it too).
SPARK_USER_MOUNT = "/etc/fjord-user"
#: What the jobs are given as ``--command-config`` on Kubernetes.
SPARK_USER_PROPERTIES = f"{SPARK_USER_MOUNT}/client.properties"
#: Name of the Secret volume in the SparkApplication manifests.
SPARK_USER_VOLUME = "fjord-user"
