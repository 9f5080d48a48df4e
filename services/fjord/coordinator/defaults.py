"""Every default of the group coordinator service, defined once here.

Names are Kafka's broker settings (in the comment); values are Kafka's. The shared group
protocol's constants (``__consumer_offsets`` name and partition count) and the consumer's group
defaults are in :mod:`fjord.groups.defaults`.
"""

from __future__ import annotations

#: ``group.min.session.timeout.ms``: the smallest session timeout a member may ask for.
GROUP_MIN_SESSION_TIMEOUT_MS = 6_000

#: ``group.max.session.timeout.ms``: the largest session timeout a member may ask for.
GROUP_MAX_SESSION_TIMEOUT_MS = 1_800_000

#: ``group.initial.rebalance.delay.ms``: how long the first rebalance of an empty group waits for
#: more members (extended by this much per new member, up to the rebalance timeout).
GROUP_INITIAL_REBALANCE_DELAY_MS = 3_000

#: ``group.max.size``: most members in one group (Kafka: Integer.MAX_VALUE, i.e. unlimited).
GROUP_MAX_SIZE = 2**31 - 1

#: Kafka's ``GroupCoordinator.NewMemberJoinTimeoutMs``: a brand-new member waiting in its first
#: join phase is dropped after this long, so a client that disconnected does not hold the
#: rebalance for its whole rebalance timeout.
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000

#: ``offset.metadata.max.bytes``: longest metadata string an offset commit may carry.
OFFSET_METADATA_MAX_BYTES = 4_096

#: ``offsets.retention.minutes`` (7 days): committed offsets of an empty group expire this long
#: after the group became empty (after the commit, for groups without a protocol type).
OFFSETS_RETENTION_MINUTES = 7 * 24 * 60
OFFSETS_RETENTION_MS = OFFSETS_RETENTION_MINUTES * 60_000

#: ``offsets.retention.check.interval.ms``: how often the shell runs offset expiry.
OFFSETS_RETENTION_CHECK_INTERVAL_MS = 600_000

# --- the coordinator service (``fjord coordinator``; the shell around the cores) ------------

#: Port used when ``--listen`` gives none (Fjord's own choice: next to the broker's 9092).
DEFAULT_COORDINATOR_PORT = 9094

#: TTL of the coordinator's etcd lease (its liveness): the controller hands the
#: ``__consumer_offsets`` partitions of a coordinator that died without revoking its lease to
#: another one this many seconds later (the brokers' default, Kafka's broker.session.timeout.ms).
COORDINATOR_LEASE_TTL_S = 9


#: Seconds to wait at start-up for the first metadata snapshot (and for the registration to
#: show up in it) before giving up.
METADATA_STARTUP_TIMEOUT_S = 30.0

#: Seconds the server lets in-flight calls finish on SIGTERM/SIGINT before cancelling them.
SHUTDOWN_GRACE_S = 5.0

#: ``offsets.commit.timeout.ms``: bound on one ``__consumer_offsets`` append (acks=all); the
#: members' requests fail with COORDINATOR_NOT_AVAILABLE (retriable) when it passes.
OFFSETS_COMMIT_TIMEOUT_MS = 5_000

#: Bound on one replay of ``__consumer_offsets`` partitions (``offsets.load`` in Kafka has
#: none); a replay that times out is retried after ``LOAD_RETRY_BACKOFF_S``, and the groups
#: of those partitions answer COORDINATOR_LOAD_IN_PROGRESS meanwhile.
OFFSETS_LOAD_TIMEOUT_S = 60.0
LOAD_RETRY_BACKOFF_S = 1.0

#: How long one poll of the replaying consumer waits for records.
OFFSETS_LOAD_POLL_S = 0.5

#: How often the ``fjord_group_lag`` gauges (log end offset via ListOffsets minus committed
#: offset) and the per-state group counts are refreshed for the groups this coordinator serves.
LAG_REFRESH_INTERVAL_S = 5.0

#: Deadline of one ListOffsets call made for the lag gauges (and of one Fetch of the first
#: uncommitted record for ``fjord_group_lag_seconds``).
LAG_LIST_OFFSETS_TIMEOUT_S = 5.0

#: ``max_bytes`` of the Fetch that reads the first uncommitted record's timestamp for
#: ``fjord_group_lag_seconds`` (the broker still returns a whole first batch if it is bigger).
LAG_FETCH_MAX_BYTES = 64 * 1024
