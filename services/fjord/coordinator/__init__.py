"""The group coordinator service (``fjord coordinator``): its pure cores (no I/O, no clocks of
their own) and the shell around them.

Cores:
- :mod:`fjord.coordinator.group`: :class:`GroupStateMachine`, one per group.
- :mod:`fjord.coordinator.offsets_log`: ``__consumer_offsets`` records and the loader.

Shell: :mod:`~fjord.coordinator.manager` (groups of the partitions it owns, effects),
:mod:`~fjord.coordinator.appender` (appends and replays ``__consumer_offsets`` through
:mod:`fjord.client`), :mod:`~fjord.coordinator.service` (gRPC) and
:mod:`~fjord.coordinator.server` (the process: etcd lease, metadata, serving); its Kafka
listener's APIs: :mod:`~fjord.coordinator.kafka_apis` and :mod:`~fjord.coordinator.kafka_groups`
(the rest of the listener is :mod:`fjord.kafka`).

The protocol it shares with clients, admin and the CLI (ConsumerProtocol bytes, assignors, lag,
``__consumer_offsets`` placement, group states) is :mod:`fjord.groups`, below this package.
See docs/groups.md for the protocol and what the gRPC shell must do around these cores.
"""
