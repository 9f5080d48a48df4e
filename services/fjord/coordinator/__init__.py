"""Consumer groups: the pure cores of the group coordinator (no I/O, no clocks of their own).

- :mod:`fjord.coordinator.group`: :class:`GroupStateMachine`, one per group.
- :mod:`fjord.coordinator.assignors`: range, roundrobin, sticky, cooperative-sticky.
- :mod:`fjord.coordinator.protocol`: Kafka's ConsumerProtocol Subscription/Assignment bytes.
- :mod:`fjord.coordinator.offsets_log`: ``__consumer_offsets`` records and the loader.
- :mod:`fjord.coordinator.lag`: lag rows and the offset-reset planner.

See docs/groups.md for the protocol and what the gRPC shell must do around these cores.
"""
