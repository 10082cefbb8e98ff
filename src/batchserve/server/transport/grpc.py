"""The gRPC transport: KServe v2's ``inference.GRPCInferenceService`` on grpcio's asyncio API.

Theory of operation
-------------------
:class:`GrpcTransport` is a third driver of the same
:class:`~batchserve.server.exchange.Exchange` life the HTTP transports carry, in the same
process, event loop, models and batchers. A ``ModelInfer`` call is one exchange:

1. **arrive**: its arrival is read from the server's clock when grpcio hands the call over;
   its head is the call's metadata the server reads (``authorization``, ``x-priority``,
   ``x-tenant``, ``x-request-timeout``, ``x-request-deadline``...) plus the call's own gRPC
   deadline, written as the ``grpc-timeout`` it came as. ``App.begin`` decides everything
   the head decides (key, drain, deadline passed or infeasible, and with one model served
   its queue) before the message is decoded. grpcio counts the call's own deadline from
   the call's arrival, so a call that waited inside grpcio until it passed reaches us with
   no time left and is refused ``DEADLINE_EXCEEDED`` here, never computed; a relative
   deadline in metadata or message (``x-request-timeout``, ``parameters.timeout``) counts
   from the hand-over instead (grpcio tells no arrival time), and an absolute
   ``x-request-deadline`` from the client's clock;
2. **feed**: the serialized message (grpcio hands it over undecoded) is parsed by
   :class:`~batchserve.server.protocols.kserve_grpc.GrpcInferEndpoint`, which tightens the
   deadline with ``parameters.timeout``, and its items are offered to the batcher;
3. **respond**: the reply the exchange built is sent: on success the serialized
   ``ModelInferResponse`` with the timing facts as trailing metadata (``x-queue-wait-s``,
   ``x-batch-size``, ``x-batch-id``, ``x-forward-s``, ``server-timing``: the HTTP headers'
   names), on failure the status code of :data:`~batchserve.server.statuses.GRPC_TABLE` for
   the reply's reason, its message, and ``x-reason``, ``retry-after`` and ``retry-after-ms``
   as trailing metadata.

``ModelStreamInfer`` runs one exchange per message of the stream, the same way, and writes
each answer as it ends (:meth:`GrpcTransport.model_stream_infer`).

A client that cancels its call (or whose deadline grpcio enforces first) cancels the
handler: the exchange is abandoned, its items leave the queue and never reach the model,
and it is counted ``cancelled``. The other RPCs read the same registry and accounting as
the HTTP routes (:mod:`batchserve.server.protocols.kserve_grpc`).

Limits: a message over the server's ``max_body_bytes`` (8 MiB by default, the HTTP body
limit) is refused by grpcio with ``RESOURCE_EXHAUSTED`` before it is read whole; call
metadata is bounded at :data:`MAX_METADATA_BYTES` (the HTTP head's limit); responses are
bounded only by the model's outputs.

Refusing a flood before batchserve reads it: grpcio's ``maximum_concurrent_rpcs`` bounds
the calls in flight at once (:func:`max_calls`). Past that bound grpcio answers a new call
``RESOURCE_EXHAUSTED`` ("Concurrent RPC limit exceeded!") itself, in its own layer on the
same event loop, without running a handler of ours: the call is neither decoded, nor
counted received, nor given ``x-reason`` or a retry delay (grpcio writes its refusals with
no trailing metadata), and grpcio counts none of them (it exposes no counter). Clients read
``RESOURCE_EXHAUSTED`` as the queue being full
either way. A stream is one call, however many requests it carries.

Draining: the application's drain refuses new calls (``UNAVAILABLE``, reason ``draining``)
and waits for every accepted exchange; :meth:`GrpcTransport.stop` then closes the listener
and gives calls still being written ``grace_s`` to finish.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from batchserve.errors import ConfigError
from batchserve.server.exchange import Exchange, Gate, Reply
from batchserve.server.http import HEAD_FIELDS, Head
from batchserve.server.protocols import kserve_grpc, triton
from batchserve.server.protocols.proto import grpc_service_pb2 as pb
from batchserve.server.statuses import GRPC_TABLE, ApiError

if TYPE_CHECKING:
    from batchserve.server.account import Account
    from batchserve.server.registry import Registry

__all__ = [
    "MAX_METADATA_BYTES",
    "SERVICE",
    "GrpcHost",
    "GrpcTransport",
    "grpc_timeout",
    "max_calls",
    "tls_credentials",
]

#: The service's full name, as clients call it.
SERVICE = "inference.GRPCInferenceService"

#: The most call metadata (names and values) grpcio accepts: the HTTP head's limit.
MAX_METADATA_BYTES = 64 * 1024

#: The metadata the server reads: the HTTP head's fields, less those of HTTP bodies (gRPC's
#: framing is grpcio's) and ``grpc-timeout`` (grpcio gives the call's deadline itself).
_FIELDS = HEAD_FIELDS - {
    b"content-type",
    b"content-length",
    b"content-encoding",
    b"inference-header-content-length",
    b"grpc-timeout",
}

#: Calls a server holds beyond what its models can hold: those being decoded or answered
#: (a refusal holds its slot while it is written). See :func:`max_calls`.
CALL_MARGIN = 64

_UNITS = ((b"n", 1e9), (b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60), (b"H", 1 / 3600))


def grpc_timeout(seconds: float) -> bytes:
    """``seconds`` as a ``grpc-timeout`` value: the finest unit that fits in 8 digits.

    Rounded down, so the deadline it gives is never later than the call's.
    """
    seconds = max(0.0, seconds)
    for unit, scale in _UNITS:
        value = math.floor(seconds * scale)
        if value < 100_000_000:
            return b"%d%s" % (value, unit)
    return b"99999999H"


def max_calls(registry: Registry) -> int:
    """The most calls worth holding in flight at once: grpcio refuses the next ones.

    The rule: for every model, its queue (``queue_size``) plus, per worker, a pass running
    and a full batch handed over ahead of it (``2 * workers * max_batch_size``); plus
    :data:`CALL_MARGIN` calls being decoded or answered. A call carries one item or more,
    so at this bound every call the models could admit still reaches the server's own
    admission, which refuses with its reason and retry delay; past it, grpcio refuses.
    """
    held = 0
    for model in registry.models.values():
        config = model.config
        held += config.queue_size + 2 * config.workers * config.max_batch_size
    return held + CALL_MARGIN


def tls_credentials(
    certfile: str, keyfile: str, *, ca_certs: str | None = None
) -> grpc.ServerCredentials:
    """Server credentials for TLS from a PEM certificate chain and its PEM private key.

    With ``ca_certs`` (a PEM file of certificate authorities), every client must present a
    certificate signed by one of them: the handshake of one that does not fails.

    Raises:
        OSError: a file cannot be read.
    """
    with open(keyfile, "rb") as key, open(certfile, "rb") as cert:
        pair = (key.read(), cert.read())
    if ca_certs is None:
        return grpc.ssl_server_credentials([pair])
    with open(ca_certs, "rb") as ca:
        roots = ca.read()
    return grpc.ssl_server_credentials([pair], root_certificates=roots, require_client_auth=True)


class Accounts(Protocol):
    """Where the statistics are read (the server's metrics)."""

    def account(self, model: str) -> Account:
        """One model's account."""


class GrpcHost(Gate, Protocol):
    """What the gRPC transport needs of the application: a :class:`Gate`, and more.

    The gate's clock, drain, limits and ``begin`` (a call is opened as an HTTP request
    is), plus the served models and the accounting the other RPCs read.
    """

    @property
    def registry(self) -> Registry:
        """The served models."""

    @property
    def metrics(self) -> Accounts:
        """The server's accounting (Triton's statistics)."""


_Request = TypeVar("_Request", bound=Message)
_Response = TypeVar("_Response", bound=Message)
_Context = grpc.aio.ServicerContext[Any, Any]


async def _abort(context: _Context, error: ApiError) -> None:
    metadata = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in error.headers())
    await context.abort(grpc.StatusCode[GRPC_TABLE[error.reason]], error.message, metadata)


def _unary(
    fn: Callable[[_Request], _Response], request_type: type[_Request]
) -> grpc.RpcMethodHandler[Any, Any]:
    # A handler whose errors are the status table's: fn raises ApiError, the call ends with
    # its code and message.
    async def handle(request: _Request, context: _Context) -> _Response:
        try:
            return fn(request)
        except ApiError as error:
            await _abort(context, error)
            raise  # unreachable: abort raises

    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=request_type.FromString,
        response_serializer=lambda m: m.SerializeToString(),
    )


class GrpcTransport:
    """The gRPC service of an application (see the module docstring).

    Args:
        host: the application (its models, clock, drain and accounting).
        max_concurrent_calls: grpcio refuses a call beyond this many in flight with
            ``RESOURCE_EXHAUSTED`` before any handler runs (see the module docstring);
            None: :func:`max_calls` of the host's models when the server starts.

    Raises:
        ConfigError: ``max_concurrent_calls`` is below 1.
    """

    def __init__(self, host: GrpcHost, *, max_concurrent_calls: int | None = None) -> None:
        if max_concurrent_calls is not None and (
            isinstance(max_concurrent_calls, bool)
            or not isinstance(max_concurrent_calls, int)
            or max_concurrent_calls < 1
        ):
            raise ConfigError(
                f"max_concurrent_calls must be an integer >= 1, got {max_concurrent_calls!r}"
            )
        self.host = host
        self.endpoint = kserve_grpc.GrpcInferEndpoint(host.registry, host.limits)
        self.server: grpc.aio.Server | None = None
        self.max_concurrent_calls = max_concurrent_calls

    def handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        """The service's methods, by name."""
        return {
            "ServerLive": _unary(self.server_live, pb.ServerLiveRequest),
            "ServerReady": _unary(self.server_ready, pb.ServerReadyRequest),
            "ModelReady": _unary(self.model_ready, pb.ModelReadyRequest),
            "ServerMetadata": _unary(self.server_metadata, pb.ServerMetadataRequest),
            "ModelMetadata": _unary(self.model_metadata, pb.ModelMetadataRequest),
            # Undecoded both ways: the endpoint decodes it once admitted, and the reply's
            # body is the serialized response.
            "ModelInfer": grpc.unary_unary_rpc_method_handler(self.model_infer),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self.model_stream_infer),
            "ModelConfig": _unary(self.model_config, pb.ModelConfigRequest),
            "ModelStatistics": _unary(self.model_statistics, pb.ModelStatisticsRequest),
            "RepositoryIndex": _unary(self.repository_index, pb.RepositoryIndexRequest),
        }

    # -- the server ------------------------------------------------------------------------

    async def start(
        self, host: str, port: int, *, credentials: grpc.ServerCredentials | None = None
    ) -> int:
        """Listen on ``host:port`` (0: a free port) and serve; returns the port bound.

        Raises:
            RuntimeError: grpcio could not bind the address.
        """
        if self.max_concurrent_calls is None:
            self.max_concurrent_calls = max_calls(self.host.registry)
        server = self.server = grpc.aio.server(
            maximum_concurrent_rpcs=self.max_concurrent_calls,
            options=[
                ("grpc.max_receive_message_length", self.host.limits.max_body_bytes),
                ("grpc.max_metadata_size", MAX_METADATA_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, self.handlers()),)
        )
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
        if not bound:
            raise RuntimeError(f"gRPC could not bind {address}")
        await server.start()
        return bound

    async def stop(self, grace_s: float | None) -> None:
        """Close the listener; calls in flight get ``grace_s`` seconds (None: all they need)."""
        if self.server is not None:
            await self.server.stop(grace_s)

    # -- ModelInfer: an exchange -----------------------------------------------------------

    async def model_infer(self, body: bytes, context: _Context) -> bytes:
        """One inference call: an exchange from head to reply (see the module docstring)."""
        host = self.host
        arrival = host.clock.now()
        head = _head(_fields(context.invocation_metadata()), context.time_remaining())
        answered: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        exchange = host.begin(self.endpoint, None, head, arrival, answered.set_result)
        try:
            if not exchange.done:
                exchange.feed(body)
            reply = await answered
        except asyncio.CancelledError:
            exchange.abandon()  # its items leave the queue: the model never sees them
            raise
        finally:
            exchange.release()
        metadata = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in reply.all_headers())
        if reply.status == 200:
            context.set_trailing_metadata(metadata)
            return reply.body
        reason = next((v for k, v in metadata if k == "x-reason"), "internal")
        await context.abort(
            grpc.StatusCode[GRPC_TABLE[reason]], reply.body.decode("utf-8", "replace"), metadata
        )
        raise AssertionError("unreachable: abort raises")

    # -- ModelStreamInfer: an exchange per message ----------------------------------------

    async def model_stream_infer(self, requests: Any, context: _Context) -> None:
        """A stream of inference requests, each its own exchange, answered as each ends.

        Each message read is opened and fed at once, as a ModelInfer call is (its deadline:
        ``parameters.timeout``, the stream's own gRPC deadline, else the model's default,
        from its arrival), so the requests of one stream batch together and with everyone
        else's. Each answer is written when it is ready, in the order they end (Triton's
        order too: match them by ``id``): a ``ModelStreamInferResponse`` holding the
        response, or the error's message in ``error_message`` (its reason is not sent: a
        stream has one status, at its end). The stream ends OK once the client has closed
        its side and every request is answered. A client that cancels the stream cancels
        every request of it still unanswered.
        """
        host = self.host
        fields = _fields(context.invocation_metadata())  # the same for every message
        # Each answer is announced by its exchange's place in ``opened`` (its respond
        # callback is made before the exchange exists; the writer reads ``opened`` later).
        answers: asyncio.Queue[int | None] = asyncio.Queue()
        opened: list[Exchange] = []

        async def read() -> None:
            while True:
                body = await context.read()
                if body is grpc.aio.EOF:
                    break
                head = _head(fields, context.time_remaining())
                respond = _put(answers, len(opened))
                exchange = host.begin(self.endpoint, None, head, host.clock.now(), respond)
                opened.append(exchange)
                if not exchange.done:
                    exchange.feed(body)
            answers.put_nowait(None)

        reader = asyncio.ensure_future(read())
        written = 0
        reading = True
        try:
            while reading or written < len(opened):
                index = await answers.get()
                if index is None:
                    reading = False
                    continue
                exchange = opened[index]
                reply = exchange.reply
                assert reply is not None
                await context.write(_stream_answer(reply))
                exchange.release()
                written += 1
            await reader
        except asyncio.CancelledError:
            for exchange in opened:
                exchange.abandon()
            raise
        finally:
            reader.cancel()
            for exchange in opened:
                exchange.release()

    # -- health, metadata and Triton's extensions ------------------------------------------

    def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        """Live while the process serves."""
        return pb.ServerLiveResponse(live=True)

    def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        """Ready when every model serves and the server is not draining."""
        host = self.host
        return pb.ServerReadyResponse(ready=not host.draining and host.registry.ready)

    def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        """Whether the model serves (NOT_FOUND: no such model or version)."""
        model = self.host.registry.require(request.name, param="name")
        triton.check_version(model.name, request.version or None)
        return pb.ModelReadyResponse(ready=model.ready and not self.host.draining)

    def server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        """Name, version and extensions."""
        return kserve_grpc.server_metadata()

    def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        """The model's inputs and outputs."""
        model = self.host.registry.require(request.name, param="name")
        triton.check_version(model.name, request.version or None)
        return kserve_grpc.model_metadata(model.name, model.loaded)

    def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        """Triton's model configuration, as served now."""
        model = self.host.registry.require(request.name, param="name")
        triton.check_version(model.name, request.version or None)
        return kserve_grpc.model_config(model)

    def model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        """One model's statistics, or every model's when ``name`` is empty."""
        registry, metrics = self.host.registry, self.host.metrics
        names: Sequence[str] = list(registry.models)
        if request.name:
            names = [registry.require(request.name, param="name").name]
            triton.check_version(names[0], request.version or None)
        return kserve_grpc.model_statistics(
            [triton.model_statistics(n, metrics.account(n)) for n in names]
        )

    def repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        """Every model (or only the ready ones) with its state."""
        models = list(self.host.registry.models.values())
        return kserve_grpc.repository_index(
            triton.repository_index(models, ready_only=request.ready)
        )


def _put(answers: asyncio.Queue[int | None], index: int) -> Callable[[Reply], None]:
    return lambda reply: answers.put_nowait(index)


def _stream_answer(reply: Reply) -> bytes:
    # A ModelStreamInferResponse, written by hand: the response's serialized bytes become
    # its field 2 (infer_response) as they are, without decoding and encoding them again.
    if reply.status == 200:
        return _INFER_RESPONSE_TAG + _varint(len(reply.body)) + reply.body
    message = reply.body.decode("utf-8", "replace")
    return pb.ModelStreamInferResponse(error_message=message).SerializeToString()


_INFER_RESPONSE_TAG = bytes([2 << 3 | 2])  # field 2, length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _fields(metadata: Iterable[tuple[str, str | bytes]] | None) -> Head:
    # The call metadata the server reads, as a head (the first value of each name).
    head: Head = {}
    if metadata:
        fields = _FIELDS
        for key, value in metadata:
            name = key.encode("latin-1")
            if name in fields and name not in head and isinstance(value, str):
                head[name] = value.encode("latin-1")
    return head


def _head(fields: Head, remaining: float | None) -> Head:
    # A request's head: the call's fields and, when the call has one, its deadline.
    head = fields.copy()
    if remaining is not None:
        head[b"grpc-timeout"] = grpc_timeout(remaining)
    return head
