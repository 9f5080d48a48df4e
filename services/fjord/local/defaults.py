"""Defaults of the local launcher (``fjord local``) and of the etcd it starts, defined once.

- ``DEFAULT_DATA_DIR`` (``.fjord``): where ``fjord local up`` keeps etcd data, broker logs,
  process logs and the state file, relative to the current directory (gitignored).
- ``DATA_DIR_ENV_VAR`` (``FJORD_DATA_DIR``): names the data directory for every ``fjord local``
  and client command; without it they use the nearest ``.fjord`` holding a state file in the
  current directory or a parent (as git finds its repository), see ``fjord.local.find``.
- The first broker's port of ``fjord local up`` and ``fjord quickstart`` is the brokers' default
  (:data:`fjord.cluster.defaults.DEFAULT_BROKER_PORT`, 9092, Kafka's) when it and the next
  ports are free (brokers take consecutive ports); otherwise they pick free ports and say so.
  ``--port`` chooses another first port.
- ``DEFAULT_BROKERS`` (3), ``DEFAULT_CONTROLLERS`` (2) and ``DEFAULT_COORDINATORS`` (2):
  processes ``fjord local up`` starts (coordinator ids start at 1).
- ``DEFAULT_CLUSTER_ID`` (``local``): the cluster id, i.e. the etcd prefix ``/fjord/local/``.
- ``LOOPBACK_HOST`` (127.0.0.1): every local process listens on loopback only.
- ``ETCD_START_TIMEOUT_S`` (20 s): bound on etcd becoming healthy.
- ``PROCESS_START_TIMEOUT_S`` (30 s): bound on each controller/broker becoming ready.
- ``STOP_TIMEOUT_S`` (10 s): grace period after SIGTERM before SIGKILL on ``down``.
- ``PORT_RETRIES`` (3): attempts with fresh ports when a picked free port was taken meanwhile.
- ``LOCAL_BROKER_LEASE_TTL_S`` (6 s): the brokers' lease TTL in a local cluster.
- ``LOCAL_COORDINATOR_LEASE_TTL_S`` (6 s): the group coordinators' lease TTL in a local
  cluster (production default: 9 s), so that a killed coordinator's groups move within seconds.
- ``LOCAL_CONTROLLER_LEASE_TTL_S`` (3 s): the controllers' leader lease TTL in a local
  cluster, short so that fail-over is quick on one machine.
- ``LOCAL_LEADER_IMBALANCE_CHECK_INTERVAL_S`` (5 s): how often the local controllers move
  leadership back to preferred replicas (production default: 300 s, Kafka's), short so that a
  restarted broker leads its partitions again within seconds.
- ``LOCAL_REPLICA_LAG_TIME_MAX_MS`` (10 s): the brokers' ``replica.lag.time.max.ms`` in a local
  cluster unless ``--config`` sets it (production default: 30 s, Kafka's), so a stopped follower
  leaves the ISR, and acks=all produces resume, within seconds.
- ``STATE_FILE`` (``cluster.json``): name of the state file (pids, addresses) in the data dir.
"""

DEFAULT_DATA_DIR = ".fjord"
DATA_DIR_ENV_VAR = "FJORD_DATA_DIR"
DEFAULT_BROKERS = 3
DEFAULT_CONTROLLERS = 2
DEFAULT_COORDINATORS = 2
LOCAL_COORDINATOR_LEASE_TTL_S = 6
DEFAULT_CLUSTER_ID = "local"
LOOPBACK_HOST = "127.0.0.1"
ETCD_START_TIMEOUT_S = 20.0
PROCESS_START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
PORT_RETRIES = 3
LOCAL_CONTROLLER_LEASE_TTL_S = 3
LOCAL_LEADER_IMBALANCE_CHECK_INTERVAL_S = 5.0
LOCAL_REPLICA_LAG_TIME_MAX_MS = 10_000
STATE_FILE = "cluster.json"
# Brokers' etcd lease TTL in a local cluster: shorter than the broker's production default so
# that fault tests see leadership move quickly, long enough to ride out a loaded 2-core machine.
LOCAL_BROKER_LEASE_TTL_S = 6
# How often readiness (etcd /health, gRPC probes, pid checks) is polled while waiting; every
# such wait is bounded by one of the timeouts above.
READY_POLL_INTERVAL_S = 0.05
# Deadline of one readiness probe (an etcd /health GET, a DescribeCluster or Metadata call).
PROBE_TIMEOUT_S = 2.0
# How often a foreground `fjord local up` checks that its processes are still alive.
MONITOR_INTERVAL_S = 1.0
