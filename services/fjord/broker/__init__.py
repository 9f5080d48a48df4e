"""The broker service: hosts partition replicas and serves Produce, Fetch, ListOffsets and
Metadata over gRPC (``fjord broker``).

Pure cores: :mod:`~fjord.broker.partition` (leadership, epochs, high watermark, produce
checks), :mod:`~fjord.broker.fetch` (fetch assembly), :mod:`~fjord.broker.purgatory` (delayed
operations) and :mod:`~fjord.broker.metadata_view`; its config schema is shared
(:mod:`fjord.cluster.broker_config`). Shells:
:mod:`~fjord.broker.replica_manager`, :mod:`~fjord.broker.service`, :mod:`~fjord.broker.server`.
"""
