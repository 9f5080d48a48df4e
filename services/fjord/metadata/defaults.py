"""Defaults of the etcd access layer shared by controllers and brokers (defined once here).

- ``ETCD_REQUEST_TIMEOUT_S`` (5 s): deadline of every unary etcd call (get, txn, lease grant),
  so a dead etcd never hangs a caller forever.
- ``WATCH_RETRY_MIN_S`` / ``WATCH_RETRY_MAX_S`` (0.1 s / 2 s): back-off between attempts to
  re-open a broken watch stream (doubling from min to max, reset after a successful event).
- ``SNAPSHOT_TIMEOUT_S`` (10 s): how long :meth:`MetadataWatcher.start` waits for the first
  consistent snapshot before raising ``TimeoutError``.
- ``REGISTRATION_RETRY_BACKOFF_S`` / ``REGISTRATION_RETRY_BACKOFF_MAX_S`` (0.5 s / 5 s): pause
  before a broker or coordinator retries its registration (the key is still held, or etcd
  failed), doubling up to the ceiling.
"""

ETCD_REQUEST_TIMEOUT_S = 5.0
WATCH_RETRY_MIN_S = 0.1
WATCH_RETRY_MAX_S = 2.0
SNAPSHOT_TIMEOUT_S = 10.0
REGISTRATION_RETRY_BACKOFF_S = 0.5
REGISTRATION_RETRY_BACKOFF_MAX_S = 5.0
