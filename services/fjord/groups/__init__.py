"""The consumer-group protocol every side shares: clients, admin, the CLI, the broker
(FindCoordinator), the controller (``__consumer_offsets`` placement) and the coordinator
service. Pure: it imports nothing but :mod:`fjord.errors`, :mod:`fjord.records`,
:mod:`fjord.topic_partition` and the standard library (``tests/unit/test_layering.py`` keeps it
so).

- :mod:`fjord.groups.defaults`: the ``__consumer_offsets`` topic and the consumer's group defaults.
- :mod:`fjord.groups.offsets_topic`: which ``__consumer_offsets`` partition holds a group.
- :mod:`fjord.groups.state`: ``GroupState``, the group states DescribeGroups names.
- :mod:`fjord.groups.protocol`: Kafka's ConsumerProtocol Subscription/Assignment bytes.
- :mod:`fjord.groups.wire`: the classic schema primitives those bytes are made of.
- :mod:`fjord.groups.assignors`: range, roundrobin, sticky, cooperative-sticky.
- :mod:`fjord.groups.lag`: lag rows and the offset-reset planner.

The coordinator service (state machine, ``__consumer_offsets`` records, gRPC shell) lives in
:mod:`fjord.coordinator`, above this package and the client it appends with. See docs/groups.md.
"""
