"""In-process grpc.aio Broker servicers for tests of the client's Network: Produce and Fetch
answered by echoing the request (unary only, or with the streams served as the broker serves
them), and a server interceptor recording every call, so a test observes which way a request
went on the server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from grpc import aio

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.rpc_streams import answer_in_order, send_stream_headers

SERVICE = "fjord.v1.Broker"
PRODUCE = f"/{SERVICE}/Produce"
FETCH = f"/{SERVICE}/Fetch"
PRODUCE_STREAM = f"/{SERVICE}/ProduceStream"
FETCH_STREAM = f"/{SERVICE}/FetchStream"


class CallsSeen(aio.ServerInterceptor):  # type: ignore[misc]
    """Records the method of every call the server receives, served or not."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        self.methods.append(details.method)
        return await continuation(details)

    def count(self, method: str) -> int:
        return self.methods.count(method)


class UnaryBroker(broker_pb2_grpc.BrokerServicer):
    """Produce and Fetch as unary calls only (the generated servicer's ProduceStream and
    FetchStream: UNIMPLEMENTED). Each answer echoes its request: a Produce's timeout_ms as
    throttle_time_ms, a Fetch's session_epoch as session_id."""

    async def Produce(
        self, request: broker_pb2.ProduceRequest, context: aio.ServicerContext
    ) -> broker_pb2.ProduceResponse:
        return broker_pb2.ProduceResponse(throttle_time_ms=request.timeout_ms)

    async def Fetch(
        self, request: broker_pb2.FetchRequest, context: aio.ServicerContext
    ) -> broker_pb2.FetchResponse:
        return broker_pb2.FetchResponse(session_id=request.session_epoch)


class StreamingBroker(UnaryBroker):
    """:class:`UnaryBroker` plus the streams, served as the real broker serves them (headers
    first, answers in order)."""

    async def ProduceStream(  # type: ignore[override]
        self, requests: AsyncIterator[broker_pb2.ProduceRequest], context: aio.ServicerContext
    ) -> AsyncIterator[broker_pb2.ProduceResponse]:
        await send_stream_headers(context)
        async for answer in answer_in_order(requests, lambda r: self.Produce(r, context), 16):
            yield answer

    async def FetchStream(  # type: ignore[override]
        self, requests: AsyncIterator[broker_pb2.FetchRequest], context: aio.ServicerContext
    ) -> AsyncIterator[broker_pb2.FetchResponse]:
        await send_stream_headers(context)
        async for answer in answer_in_order(requests, lambda r: self.Fetch(r, context), 1):
            yield answer


def produce(timeout_ms: int) -> broker_pb2.ProduceRequest:
    return broker_pb2.ProduceRequest(acks=1, timeout_ms=timeout_ms)


def fetch(epoch: int) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(replica_id=-1, session_epoch=epoch)
