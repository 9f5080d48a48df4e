"""Defaults of the cluster's config keys, defined once here and shared: the broker and the
controller read them, the operator, ``fjord local`` and the CLI check configs against them.

Names follow Kafka's settings (in the comment); values are Kafka's unless a comment says why
Fjord differs. Service-internal constants (timeouts, intervals, sizes no key sets) stay in each
service's ``defaults`` module.
"""

from __future__ import annotations

# --- broker ------------------------------------------------------------------------------------

#: Port used when ``--listen`` gives none (Kafka's usual 9092).
DEFAULT_BROKER_PORT = 9092

#: ``min.insync.replicas`` when neither the topic nor the cluster config sets it.
DEFAULT_MIN_INSYNC_REPLICAS = 1

#: ``auto.create.topics.enable``: off in Fjord (Kafka's default is on). Topics are created
#: through the controller (``fjord topics create``); a Metadata request asking for
#: auto-creation gets UNKNOWN_TOPIC_OR_PARTITION like any other unknown topic.
AUTO_CREATE_TOPICS_ENABLE = False

#: ``log.retention.check.interval.ms``: how often retention (retention.ms / retention.bytes)
#: runs (Kafka: 5 min; 30 s here so that short local demos see it). A broker config key.
RETENTION_CHECK_INTERVAL_MS = 30_000

# --- controller (cluster-config) --------------------------------------------------------------

#: ``num.partitions`` (1) and ``default.replication.factor`` (1): used when CreateTopics asks for
#: -1; overridable in ``cluster-config``.
NUM_PARTITIONS = 1
DEFAULT_REPLICATION_FACTOR = 1

# Limits that keep one request from taking the cluster down (refused with POLICY_VIOLATION, the
# message naming the limit; both can be raised in ``cluster-config``, e.g.
# ``fjord local up --config max.broker.partitions=8000``):
#
# - ``MAX_RECORDS_PER_USER_OP`` (10000, key ``max.records.per.user.op``): the most metadata
#   records one CreateTopics / CreatePartitions entry may write, counted as Kafka's controller
#   counts them (one per new partition, one for the topic record, one per topic config). Kafka's
#   KRaft controller refuses larger operations with the same number (``MAX_RECORDS_PER_USER_OP``):
#   every record is applied by every broker, and one huge batch is minutes of work that nothing
#   else can interleave with.
# - ``MAX_BROKER_PARTITIONS`` (1000, key ``max.broker.partitions``, Kafka's KIP-578 name): the
#   most partition replicas one broker may host; a request whose placement would put more on any
#   live broker is refused. Kafka's operators are advised to stay under 4000 per broker, but a
#   Fjord broker is one Python process whose periodic passes (follower fetches, flush, roll,
#   retention, high-watermark checkpoint) each touch every replica: measured on 3 brokers
#   sharing 2 loaded cores, 4000 replicas each starved lease keep-alives (leases lost, leaders
#   flapping) while 1000 each kept acks=all writes to other topics flowing (bench/RESULTS.md).
MAX_RECORDS_PER_USER_OP = 10000
MAX_BROKER_PARTITIONS = 1000

# Defaults of the topic configs that neither storage (fjord.storage.defaults) nor the broker
# (min.insync.replicas, above) define; Kafka's values. Shown by DescribeConfigs.
OTHER_TOPIC_CONFIG_DEFAULTS: dict[str, str] = {
    "compression.type": "producer",
    "unclean.leader.election.enable": "false",
    "message.timestamp.difference.max.ms": str(2**63 - 1),
    "preallocate": "false",
}
