"""Transactions' settings, defined once (Kafka's names and values)."""

from __future__ import annotations

#: Name of the internal topic holding every transactional id's state.
TRANSACTION_STATE_TOPIC = "__transaction_state"

#: ``transaction.state.log.num.partitions``: a transactional id lives in partition
#: ``abs(javaStringHashCode(id)) % 50`` (:func:`fjord.transactions.log.transaction_partition`).
TRANSACTION_STATE_PARTITIONS = 50

#: ``transaction.max.timeout.ms``: the largest ``transaction.timeout.ms`` a producer may ask.
TRANSACTION_MAX_TIMEOUT_MS = 900_000

#: ``transaction.timeout.ms`` (producer default).
TRANSACTION_TIMEOUT_MS = 60_000

#: ``transaction.abort.timed.out.transaction.cleanup.interval.ms``: how often the coordinator
#: looks for transactions older than their timeout.
ABORT_TIMED_OUT_INTERVAL_MS = 10_000

#: ``transactional.id.expiration.ms``: an idle, finished transactional id is forgotten.
TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000

#: The largest producer epoch (Kafka's Short.MAX_VALUE); a bump past it takes a new id.
MAX_PRODUCER_EPOCH = 32767

#: No producer id / epoch.
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
