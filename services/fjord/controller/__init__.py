"""The controller: cluster metadata in etcd, one active controller elected on a lease.

Pure cores: :mod:`~fjord.controller.topics` (name rules), :mod:`~fjord.controller.placement`
(replica placement), :mod:`~fjord.controller.election` (leader/ISR rules, preferred and unclean
elections), :mod:`~fjord.controller.reassignment` (the reassignment state machine),
:mod:`~fjord.controller.planner` (what each request writes),
:mod:`~fjord.controller.offsets_owners` (``__consumer_offsets`` settings and owners). The config
schemas it validates against and the reassignment planner are shared: :mod:`fjord.cluster`. Shells:
:mod:`~fjord.controller.service` (election, lease, fenced etcd writes) and
:mod:`~fjord.controller.server` (the gRPC servicer and process entry).
"""
