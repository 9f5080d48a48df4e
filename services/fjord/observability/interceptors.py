"""grpc.aio interceptors: one span and one metrics sample around every RPC, on both sides.

Usage::

    server = grpc.aio.server(interceptors=server_interceptors("broker"))
    channel = grpc.aio.insecure_channel(target, interceptors=client_interceptors("producer"))

Server side: the parent context is extracted from the W3C ``traceparent``/``tracestate`` gRPC
metadata of the request; the span (kind SERVER, named ``fjord.v1.Broker/Produce``) is made
current while the handler runs, so spans the handler starts, and calls it makes through an
intercepted channel, are its children. The final status is the code the handler set
(``context.set_code`` / ``context.abort``), ``UNKNOWN`` for an exception, ``CANCELLED`` when the
client went away, else ``OK``.

Client side: a span (kind CLIENT) is started as a child of the caller's current span, its
context is injected into the call's metadata, and the span ends with the call's final status.
Unary calls are awaited inside the interceptor (the caller's ``await`` then returns the cached
result); streaming calls are finished from the call's done callback.

Invariant: each RPC gives exactly one ``fjord_rpc_{server,client}_requests_total`` increment and
one latency observation, whatever its outcome; a span is always ended. When no tracer provider is
installed the spans are OpenTelemetry's non-recording ones, which still carry an incoming trace
context through to outgoing calls.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc import aio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from fjord.observability.defaults import TRACEPARENT_HEADER, TRACESTATE_HEADER
from fjord.observability.metrics import record_rpc
from fjord.observability.tracing import W3C_PROPAGATOR, get_tracer

_TRACE_KEYS = (TRACEPARENT_HEADER, TRACESTATE_HEADER)
# Strong references to the tasks that finish streaming calls (the loop keeps only weak ones).
_pending_finishers: set[asyncio.Future[None]] = set()


def _method_name(method: str | bytes) -> str:
    """``/fjord.v1.Broker/Produce`` (str or bytes) -> ``fjord.v1.Broker/Produce``."""
    if isinstance(method, bytes):
        method = method.decode("ascii", "replace")
    return method.lstrip("/")


@functools.lru_cache(maxsize=1024)
def _span_attributes(method: str) -> dict[str, str]:
    # Cached: the SDK copies attributes into the span, so sharing the dict is safe.
    service, _, rpc_method = method.rpartition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc_method}


def _end_span(span: trace.Span, code: grpc.StatusCode, details: str | None = None) -> None:
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is not grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, details or code.name))
    span.end()


def _parent_from_metadata(metadata: Sequence[Any] | None) -> Context | None:
    if not metadata:
        return None
    carrier: dict[str, str] = {}
    for item in metadata:
        key, value = item[0], item[1]
        if key in _TRACE_KEYS and isinstance(value, str):
            carrier[key] = value
    if not carrier:
        return None
    return W3C_PROPAGATOR.extract(carrier, context=Context())


def _parent_of(context: aio.ServicerContext) -> Context | None:
    return _parent_from_metadata(context.invocation_metadata())


# --- server ---------------------------------------------------------------------------------


class _ServerRpc:
    """The bookkeeping of one server-side RPC: span, clock, and the final status.

    Invariant: created when the handler starts, ``finish`` called exactly once when it ends
    (returned, raised or was cancelled); the span is current in between.
    """

    __slots__ = ("_service", "_start", "_token", "method", "span")

    def __init__(
        self, tracer: trace.Tracer, service: str, method: str, parent: Context | None
    ) -> None:
        self._service = service
        self.method = method
        self.span = tracer.start_span(
            method, context=parent, kind=SpanKind.SERVER, attributes=_span_attributes(method)
        )
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        self._start = time.perf_counter()

    def finish(
        self, context: aio.ServicerContext, error: BaseException | None, *, detach: bool = True
    ) -> None:
        """``detach`` False: the span's context is not detached (see streaming_response)."""
        code = _server_code(context, error)
        if detach:
            otel_context.detach(self._token)
        if error is not None and code is grpc.StatusCode.UNKNOWN:
            self.span.record_exception(error)
        details = None if code is grpc.StatusCode.OK else _safe_details(context)
        _end_span(self.span, code, details)
        record_rpc(
            "server", self._service, self.method, code.name, time.perf_counter() - self._start
        )


def _server_code(context: aio.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    try:
        code = context.code()
    except Exception:  # a context without the (experimental) accessor: judge by the outcome
        code = None
    if isinstance(code, grpc.StatusCode):
        return code
    if error is None:
        return grpc.StatusCode.OK
    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


def _safe_details(context: aio.ServicerContext) -> str | None:
    try:
        details = context.details()
    except Exception:
        return None
    if isinstance(details, bytes):
        return details.decode("utf-8", "replace")
    return details if isinstance(details, str) else None


class FjordServerInterceptor(aio.ServerInterceptor):
    """Span + metrics around every RPC of a grpc.aio server (see the module docstring).

    Invariant: the handler cache holds at most one wrapper per method, and a wrapper is reused
    only for the very handler object it wraps.
    """

    def __init__(self, service: str, tracer_provider: TracerProvider | None = None) -> None:
        self.service = service
        self._tracer = get_tracer(tracer_provider)
        # method -> (the servicer's handler, our wrapper of it): building a handler per call
        # would cost more than the span and the metrics together.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        cached = self._wrapped.get(handler_call_details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, _method_name(handler_call_details.method))
        self._wrapped[handler_call_details.method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        service = self.service
        tracer = self._tracer

        if handler.unary_unary is not None:
            behavior = handler.unary_unary

            async def unary_unary(request: Any, context: aio.ServicerContext) -> Any:
                rpc = _ServerRpc(tracer, service, method, _parent_of(context))
                try:
                    result = behavior(request, context)
                    if inspect.isawaitable(result):
                        result = await result
                except BaseException as exc:
                    rpc.finish(context, exc)
                    raise
                rpc.finish(context, None)
                return result

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )

        if handler.stream_unary is not None:
            stream_behavior = handler.stream_unary

            async def stream_unary(request_iterator: Any, context: aio.ServicerContext) -> Any:
                rpc = _ServerRpc(tracer, service, method, _parent_of(context))
                try:
                    result = stream_behavior(request_iterator, context)
                    if inspect.isawaitable(result):
                        result = await result
                except BaseException as exc:
                    rpc.finish(context, exc)
                    raise
                rpc.finish(context, None)
                return result

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, handler.request_deserializer, handler.response_serializer
            )

        streaming = handler.unary_stream or handler.stream_stream
        if streaming is None:
            return handler
        stream_response_behavior = streaming

        async def streaming_response(
            request: Any, context: aio.ServicerContext
        ) -> AsyncIterator[Any]:
            rpc = _ServerRpc(tracer, service, method, _parent_of(context))
            try:
                result = stream_response_behavior(request, context)
                if hasattr(result, "__aiter__"):
                    async for item in result:
                        yield item
                elif hasattr(result, "__iter__"):
                    for item in result:
                        yield item
                elif inspect.isawaitable(result):
                    await result
            except GeneratorExit:
                # Closed while suspended at a yield: when the client went away as an answer
                # was being sent, grpc.aio drops the generator and the loop's finalizer closes
                # it later, in a task and context of its own, where the span's context cannot
                # be detached (OpenTelemetry logs an error with a traceback). The task that
                # attached it is gone, and its context with it.
                rpc.finish(context, asyncio.CancelledError(), detach=False)
                raise
            except BaseException as exc:
                rpc.finish(context, exc)
                raise
            rpc.finish(context, None)

        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                streaming_response, handler.request_deserializer, handler.response_serializer
            )
        return grpc.stream_stream_rpc_method_handler(
            streaming_response, handler.request_deserializer, handler.response_serializer
        )


# --- client ---------------------------------------------------------------------------------


class _ClientInterceptorBase:
    """Span + metrics + ``traceparent`` injection around every call of a grpc.aio channel.

    grpc.aio files each interceptor object under the first call kind it implements only, so
    :func:`client_interceptors` returns one subclass instance per kind, all sharing this code.
    """

    def __init__(self, service: str, tracer_provider: TracerProvider | None = None) -> None:
        self.service = service
        self._tracer = get_tracer(tracer_provider)

    def _start(
        self, client_call_details: aio.ClientCallDetails
    ) -> tuple[str, trace.Span, aio.ClientCallDetails, float]:
        method = _method_name(client_call_details.method)
        span = self._tracer.start_span(
            method, kind=SpanKind.CLIENT, attributes=_span_attributes(method)
        )
        carrier: dict[str, str] = {}
        W3C_PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        if carrier:
            metadata = aio.Metadata()
            for key, value in client_call_details.metadata or ():
                if key not in _TRACE_KEYS:
                    metadata.add(key, value)
            for key, value in carrier.items():
                metadata.add(key, value)
            client_call_details = client_call_details._replace(metadata=metadata)
        return method, span, client_call_details, time.perf_counter()

    def _finish(
        self,
        method: str,
        span: trace.Span,
        start: float,
        code: grpc.StatusCode,
        details: str | None,
    ) -> None:
        _end_span(span, code, details)
        record_rpc("client", self.service, method, code.name, time.perf_counter() - start)

    async def _unary_response(
        self, continuation: Callable[..., Any], details: aio.ClientCallDetails, request: Any
    ) -> Any:
        method, span, details, start = self._start(details)
        call = None
        try:
            call = await continuation(details, request)
            await call
        except aio.AioRpcError as exc:
            self._finish(method, span, start, exc.code(), exc.details())
            if call is None:
                raise
            return call  # the caller's own await raises the same error, as without us
        except asyncio.CancelledError:
            self._finish(method, span, start, grpc.StatusCode.CANCELLED, None)
            raise
        except BaseException as exc:
            span.record_exception(exc)
            self._finish(method, span, start, grpc.StatusCode.UNKNOWN, str(exc))
            raise
        self._finish(method, span, start, grpc.StatusCode.OK, None)
        return call

    async def _stream_response(
        self, continuation: Callable[..., Any], details: aio.ClientCallDetails, request: Any
    ) -> Any:
        method, span, details, start = self._start(details)
        try:
            call = await continuation(details, request)
        except BaseException as exc:
            self._finish(method, span, start, grpc.StatusCode.UNKNOWN, str(exc))
            raise

        async def finish_when_done() -> None:
            try:
                code = await call.code()
                call_details = await call.details()
            except asyncio.CancelledError:
                code, call_details = grpc.StatusCode.CANCELLED, None
            self._finish(method, span, start, code, call_details)

        def on_done(_call: Any) -> None:
            # The call is over: code() resolves at once, but only through the event loop.
            task = asyncio.ensure_future(finish_when_done())
            _pending_finishers.add(task)
            task.add_done_callback(_pending_finishers.discard)

        call.add_done_callback(on_done)
        return call


class _UnaryUnaryInterceptor(_ClientInterceptorBase, aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self,
        continuation: Callable[..., Any],
        client_call_details: aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        return await self._unary_response(continuation, client_call_details, request)


class _UnaryStreamInterceptor(_ClientInterceptorBase, aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        return await self._stream_response(continuation, client_call_details, request)


class _StreamUnaryInterceptor(_ClientInterceptorBase, aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self,
        continuation: Callable[..., Any],
        client_call_details: aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        return await self._unary_response(continuation, client_call_details, request_iterator)


class _StreamStreamInterceptor(_ClientInterceptorBase, aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        return await self._stream_response(continuation, client_call_details, request_iterator)


def server_interceptors(
    service: str, tracer_provider: TracerProvider | None = None
) -> list[aio.ServerInterceptor]:
    """Interceptors for ``grpc.aio.server(interceptors=...)``; ``service`` labels the metrics.

    Spans go to the global tracer provider (see :func:`~fjord.observability.setup_tracing`)
    unless ``tracer_provider`` is given (tests use their own, leaving the global one alone).
    """
    return [FjordServerInterceptor(service, tracer_provider)]


def client_interceptors(
    service: str = "client", tracer_provider: TracerProvider | None = None
) -> list[aio.ClientInterceptor]:
    """Interceptors for ``grpc.aio.insecure_channel(..., interceptors=...)``.

    ``service`` is the role of the calling process (``producer``, ``broker`` for replica fetches,
    ...), used as the ``service`` label of the client metrics; ``tracer_provider`` as above.
    """
    kinds = (
        _UnaryUnaryInterceptor,
        _UnaryStreamInterceptor,
        _StreamUnaryInterceptor,
        _StreamStreamInterceptor,
    )
    return [kind(service, tracer_provider) for kind in kinds]
