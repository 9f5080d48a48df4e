"""The broker service: hosts partition replicas and serves Produce, Fetch, ListOffsets and
Metadata over gRPC (``fjord broker``).

Pure cores: :mod:`~fjord.broker.partition` (leadership, epochs, high watermark, produce
checks), :mod:`~fjord.broker.fetch` (fetch assembly), :mod:`~fjord.broker.purgatory` (delayed
operations); the Metadata answer (:mod:`fjord.metadata.view`), the FindCoordinator lookup
(:mod:`fjord.metadata.coordinator_lookup`) and its config schema (:mod:`fjord.cluster`) are
shared. Shells: :mod:`~fjord.broker.replica_manager`, :mod:`~fjord.broker.service`,
:mod:`~fjord.broker.server`; its Kafka listener's handlers: :mod:`~fjord.broker.kafka_apis`
(the rest of the listener is :mod:`fjord.kafka`).
"""
