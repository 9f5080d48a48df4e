"""Defaults of the quickstart demonstration (``fjord quickstart``), defined once.

- ``ORDERS_TOPIC`` / ``SHIPMENTS_TOPIC``: the two topics of the seeds' first scenario (an order
  service decoupled from a shipping service).
- ``DEMO_PARTITIONS`` (6): partitions per topic, more than brokers so that keyed partitioning
  and leader spread are visible in the summary.
- ``DEMO_REPLICATION_FACTOR`` (3): every broker of the 3-broker local cluster holds a replica.
- ``DEMO_RECORDS`` (10,000): orders written by default; a few seconds on a laptop.
- ``DEMO_BROKERS`` (3) / ``DEMO_CONTROLLERS`` (2): the local cluster the quickstart starts.
- ``STAGE_TIMEOUT_S`` (120 s): bound on each stage (write, process, verify); a stage that
  makes no progress for this long fails with a clear message instead of hanging.
- ``POLL_TIMEOUT_S`` (0.5 s): one ``Consumer.poll`` wait inside a stage.
- ``CLUSTER_WATCH_INTERVAL_S`` (1 s): while waiting for Ctrl-C, how often the quickstart checks
  that the cluster is still up (someone may run ``fjord local down`` from another terminal).
- ``PRODUCER_ACKS`` (``all``): orders and shipments are acknowledged by every in-sync replica.
"""

ORDERS_TOPIC = "orders"
SHIPMENTS_TOPIC = "shipments"
DEMO_PARTITIONS = 6
DEMO_REPLICATION_FACTOR = 3
DEMO_RECORDS = 10_000
DEMO_BROKERS = 3
DEMO_CONTROLLERS = 2
STAGE_TIMEOUT_S = 120.0
POLL_TIMEOUT_S = 0.5
CLUSTER_WATCH_INTERVAL_S = 1.0
PRODUCER_ACKS = "all"
