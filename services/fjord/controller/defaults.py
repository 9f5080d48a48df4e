"""Controller defaults, defined once here (and documented in docs/operations.md).

- ``LEASE_TTL_S`` (10 s): TTL of the controller's etcd lease. A controller that stops
  refreshing it (crash, partition) loses the ``controller`` key after at most this long and a
  standby takes over. ``fjord local`` uses a shorter TTL (``fjord.local.defaults``).
- ``KEEPALIVE_FRACTION`` (1/3): the lease is refreshed every TTL x this fraction, so two
  refreshes can be lost before the lease expires.
- ``STEP_DOWN_MARGIN_S`` (0.5 s): the controller stops acting this long *before* its lease
  could have expired by its own clock (last successful refresh + TTL), so it never acts while
  a successor may already be elected.
- ``WRITE_SETTLE_TIMEOUT_S`` (5 s): how long a request waits for its own metadata write to
  reach the controller's watcher (so the next request sees it).
- ``PRODUCER_ID_BLOCK_SIZE`` (1000): producer ids handed out per AllocateProducerIds.
- ``MAX_TXN_OPS`` (128): etcd's default limit of operations per transaction; larger metadata
  changes are split (each part fenced on its own).
- ``REQUEST_TIMEOUT_MS`` (30000): default for requests that carry ``timeout_ms`` = 0.
- ``BROKER_REREGISTRATION_GRACE_S`` (6 s): after taking office, a controller leaves the
  leaders and ISRs that name an unregistered broker alone this long (Kafka's KRaft controller
  likewise gives every broker a fresh session when it becomes active). After an etcd outage
  longer than the leases every registration is gone at once; the brokers, which served on
  through the outage, register again within one keep-alive interval (a third of their TTL), so
  without the grace the new controller would take every partition offline first. A broker that
  really died is handled when the grace ends: fail-over then takes up to this much longer when
  it coincides with a controller fail-over.

The defaults of the cluster-config keys the controller reads (``num.partitions``,
``default.replication.factor``, the limits) are :mod:`fjord.cluster.defaults`'.
"""

LEASE_TTL_S = 10
KEEPALIVE_FRACTION = 1 / 3
STEP_DOWN_MARGIN_S = 0.5
WRITE_SETTLE_TIMEOUT_S = 5.0
PRODUCER_ID_BLOCK_SIZE = 1000
MAX_TXN_OPS = 128
REQUEST_TIMEOUT_MS = 30000
BROKER_REREGISTRATION_GRACE_S = 6.0

# Preferred-leader rebalancing (Kafka's auto.leader.rebalance.enable and
# leader.imbalance.check.interval.seconds): every interval the active controller moves
# leadership back to each partition's preferred replica (the first in its replica list) when
# that replica is live and in the ISR. Kafka checks every 300 s; ``fjord local`` and tests
# pass ``--leader-imbalance-check-interval`` (LOCAL_LEADER_IMBALANCE_CHECK_INTERVAL_S, 5 s)
# so a restarted broker leads again quickly. Kafka's per-broker imbalance threshold (10 %) is
# not modelled: any partition led by a non-preferred replica is moved.
AUTO_LEADER_REBALANCE_ENABLE = True
LEADER_IMBALANCE_CHECK_INTERVAL_S = 300.0

# The internal topic ``__consumer_offsets`` (its name and partition count,
# ``offsets.topic.num.partitions`` = 50, live in fjord.groups.defaults, shared with
# group_partition's users). Kafka's broker settings, created on the first FindCoordinator:
# - ``offsets.topic.replication.factor`` (3): capped at the number of live brokers when the
#   topic is created (Kafka refuses instead; a one-broker ``fjord local`` must still work).
# - ``offsets.topic.segment.bytes`` (100 MiB).
# - ``cleanup.policy`` = compact, as Kafka: the brokers' log cleaners keep the last record of
#   each group and offset key (tombstones until delete.retention.ms), so a coordinator that
#   takes a partition over replays only what is live. Retention never deletes (compact alone).
OFFSETS_TOPIC_REPLICATION_FACTOR = 3
OFFSETS_TOPIC_SEGMENT_BYTES = 100 * 1024 * 1024
OFFSETS_TOPIC_CONFIG: dict[str, str] = {
    "segment.bytes": str(OFFSETS_TOPIC_SEGMENT_BYTES),
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "retention.bytes": "-1",
}

# A standby re-checks the ``controller`` key at least this often even without a watch event,
# and an election attempt that failed (etcd unreachable) is retried after ELECTION_RETRY_S.
ELECTION_POLL_S = 1.0
ELECTION_RETRY_S = 0.5

# Seconds in-flight RPCs get to finish on SIGTERM before the lease is revoked.
SHUTDOWN_GRACE_S = 1.0
