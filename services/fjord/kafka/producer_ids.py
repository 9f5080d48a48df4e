"""InitProducerId between Kafka's protocol and the broker's gRPC message, for every Kafka door (a
broker answers it itself, a coordinator forwards it to a broker)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer.transaction import InitProducerIdResponse

from fjord._proto import broker_pb2

#: InitProducerId versions served.
INIT_PRODUCER_ID_VERSIONS = (0, 5)


def init_producer_id_pb(request: Any) -> broker_pb2.InitProducerIdRequest:
    return broker_pb2.InitProducerIdRequest(
        transactional_id=request.transactional_id or "",
        transaction_timeout_ms=request.transaction_timeout_ms,
    )


def init_producer_id_response(answer: broker_pb2.InitProducerIdResponse, version: int) -> Any:
    return InitProducerIdResponse[version](
        throttle_time_ms=0,
        error_code=answer.error.code,
        producer_id=answer.producer_id,
        producer_epoch=answer.producer_epoch,
    )
