"""The load generator's gRPC side: KServe ``ModelInfer`` calls on one ``grpc.aio`` channel.

A ``grpc://host:port`` URL makes :class:`~batchserve.loadgen.sender.Sender` send through a
:class:`GrpcPool` instead of the HTTP/1.1 :class:`~batchserve.loadgen.client.Pool`: the same
open-loop schedule, the same records. What differs is only the wire:

* a request is a serialized ``ModelInferRequest`` encoded once before the run
  (:func:`encode_infer`: the texts as one ``BYTES`` input in ``raw_input_contents``, as
  tritonclient sends them, with ``parameters.timeout`` and ``parameters.priority``), plus
  call metadata named like the HTTP headers (``x-request-timeout``, ``x-request-deadline``
  filled in at send time, ``x-priority``, ``x-tenant``, ``authorization``). No gRPC
  deadline is set on the call: the server judges the deadline it is told, as over HTTP, and
  answers ``DEADLINE_EXCEEDED`` itself;
* HTTP/2 multiplexes every call on one connection, so a request never waits for a free
  one: :meth:`GrpcPool.submit` starts the call at once;
* the answer is the call's status code, read as the HTTP status of the same outcome
  (:data:`HTTP_STATUS`: ``RESOURCE_EXHAUSTED`` 429, ``UNAVAILABLE`` 503,
  ``DEADLINE_EXCEEDED`` 504...), and its trailing metadata, where the server puts what it
  puts in HTTP headers: ``x-reason``, ``x-batch-id`` and ``server-timing``.
  ``UNAVAILABLE`` without an ``x-reason`` is the channel's (no server answered): status 0,
  as a failed connection over HTTP.

grpcio's asyncio API runs each call as a task of its own; :class:`GrpcPool` adds one
coroutine per call that awaits it and records the answer, a task of the group of
:meth:`GrpcPool.running` (leaving it waits for every one). A request abandoned at the
client's give-up time has its call cancelled (the server sees the cancellation).

Needs the ``grpc`` extra (grpcio and protobuf).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
import grpc.aio

from batchserve.loadgen.client import Completion, PoolStatistics, server_total_s
from batchserve.loadgen.config import LoadConfig
from batchserve.server.protocols.proto import grpc_service_pb2 as pb
from batchserve.server.protocols.tensors import pack_bytes

__all__ = ["HTTP_STATUS", "METHOD", "GrpcPool", "Metadata", "encode_infer", "infer_metadata"]

#: The full name of KServe v2's inference method.
METHOD = "/inference.GRPCInferenceService/ModelInfer"

#: Call metadata: (name, value) pairs, names in lower case.
Metadata = tuple[tuple[str, str], ...]

#: A gRPC status code as the HTTP status of the same outcome (Google's ``google.rpc.Code``
#: mapping, which the server's status table follows), so the report counts both alike.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}

#: The metadata name of the absolute deadline, filled in when a call starts.
DEADLINE_KEY = "x-request-deadline"

#: How long :meth:`GrpcPool.warm` waits for the channel to connect.
CONNECT_TIMEOUT_S = 10.0


def encode_infer(config: LoadConfig, texts: Sequence[str]) -> bytes:
    """The serialized ``ModelInferRequest`` carrying ``texts`` as one ``BYTES`` input."""
    msg = pb.ModelInferRequest(model_name=config.model)
    msg.inputs.add(name=config.kserve_input, datatype="BYTES", shape=[len(texts)])
    msg.raw_input_contents.append(pack_bytes([t.encode() for t in texts]))
    if config.timeout_s is not None:
        msg.parameters["timeout"].int64_param = round(config.timeout_s * 1e6)
    if config.priority is not None:
        if config.priority.isdigit():
            msg.parameters["priority"].int64_param = int(config.priority)
        else:
            msg.parameters["priority"].string_param = config.priority
    return msg.SerializeToString()


def infer_metadata(config: LoadConfig) -> Metadata:
    """The call metadata every request carries, named like the HTTP headers.

    The absolute deadline's value is empty: the sender writes each call's own.
    """
    pairs: list[tuple[str, str]] = []
    if config.api_key:
        pairs.append(("authorization", f"Bearer {config.api_key}"))
    if config.priority is not None:
        pairs.append(("x-priority", config.priority))
    if config.tenant is not None:
        pairs.append(("x-tenant", config.tenant))
    if config.timeout_s is not None:
        pairs.append(("x-request-timeout", f"{config.timeout_s:.6f}".rstrip("0").rstrip(".")))
        if config.absolute_deadline:
            pairs.append((DEADLINE_KEY, ""))
    return tuple(pairs)


class GrpcPool:
    """``ModelInfer`` calls to one server on one channel, with the HTTP pool's surface.

    Args:
        host: an address to connect to.
        port: the TCP port.
        data: the serialized request of a request index.
        metadata: the call metadata of a request index.
        now: the clock that stamps send and receive times, in seconds.
        on_sent: called with ``(index, t_sent)`` just before a call starts.
        on_done: called once per submitted request when it ends (see
            :data:`~batchserve.loadgen.client.Completion`).
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        data: Callable[[int], bytes],
        metadata: Callable[[int], Metadata],
        now: Callable[[], float],
        on_sent: Callable[[int, float], None],
        on_done: Completion,
    ) -> None:
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._channel = grpc.aio.insecure_channel(self._address)
        # No serializers: the request goes as the bytes encoded before the run, and the
        # response is not decoded (its trailing metadata is what the report reads).
        self._infer: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(
            METHOD
        )
        self._data = data
        self._metadata = metadata
        self.now = now
        self._on_sent = on_sent
        self._on_done = on_done
        self._inflight: dict[int, grpc.aio.UnaryUnaryCall[bytes, bytes]] = {}
        self._group: asyncio.TaskGroup | None = None
        self._connected = False

    def statistics(self) -> PoolStatistics:
        """The connection counters: one channel, opened once (calls never wait for it)."""
        opened = 1 if self._connected else 0
        return PoolStatistics(opened=opened, open=opened, peak_open=opened)

    @property
    def pending(self) -> int:
        """Requests submitted and not yet ended."""
        return len(self._inflight)

    async def warm(self, count: int) -> None:
        """Connect the channel now (before a run starts), if ``count`` > 0.

        Raises:
            OSError: the channel did not connect within :data:`CONNECT_TIMEOUT_S`.
        """
        if count <= 0:
            return
        try:
            await asyncio.wait_for(self._channel.channel_ready(), CONNECT_TIMEOUT_S)
        except TimeoutError:
            await self._channel.close()
            raise OSError(
                f"cannot connect to {self._address}: no gRPC channel within {CONNECT_TIMEOUT_S:g} s"
            ) from None
        self._connected = True

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The block within which calls are started: its task group owns their waiters.

        Leaving it waits until every call's answer is recorded (or its call cancelled:
        :meth:`close`); a waiter that raises cancels the block and is raised from it.
        """
        async with asyncio.TaskGroup() as group:
            self._group = group
            yield

    def submit(self, index: int) -> None:
        """Start the call of request ``index`` now (within :meth:`running` only)."""
        group = self._group
        if group is None:
            raise RuntimeError("a GrpcPool starts calls within `async with pool.running()` only")
        metadata = self._metadata(index)
        self._on_sent(index, self.now())
        call = self._infer(self._data(index), metadata=metadata)
        self._inflight[index] = call
        group.create_task(self._wait(index, call))

    def abandon(self, index: int, reason: str) -> bool:
        """End request ``index`` now with status 0 and ``reason``, cancelling its call.

        Returns:
            True if the request was still pending.
        """
        call = self._inflight.pop(index, None)
        if call is None:
            return False
        call.cancel()
        self._on_done(index, 0, reason, None, math.nan, self.now())
        return True

    def close(self) -> None:
        """Stop: cancel what is still in flight (call when no request is pending)."""
        for call in self._inflight.values():
            call.cancel()

    async def wait_closed(self) -> None:
        """Close the channel (after :meth:`running`: the calls' waiters are done)."""
        await self._channel.close()

    async def _wait(self, index: int, call: grpc.aio.UnaryUnaryCall[bytes, bytes]) -> None:
        try:
            await call
            t_done = self.now()
            code = grpc.StatusCode.OK
            details = ""
            trailing = await call.trailing_metadata()
        except grpc.aio.AioRpcError as error:
            t_done = self.now()
            code = error.code()
            details = error.details() or ""
            trailing = error.trailing_metadata()
        except asyncio.CancelledError:
            return  # abandoned: already ended
        if self._inflight.pop(index, None) is None:
            return
        reason: str | None = None
        batch_ids: bytes | None = None
        server_s = math.nan
        for key, value in trailing or ():
            if isinstance(value, bytes):
                continue
            if key == "x-reason":
                reason = value
            elif key == "x-batch-id":
                batch_ids = value.encode("latin-1")
            elif key == "server-timing":
                server_s = server_total_s(value.encode("latin-1"))
        status = HTTP_STATUS.get(code, 500)
        if code is not grpc.StatusCode.OK and reason is None:
            if code is grpc.StatusCode.UNAVAILABLE:
                status = 0  # the channel's, not the server's: no server answered
            reason = f"{code.name.lower()}: {details}"[:200]
        self._on_done(index, status, reason, batch_ids, server_s, t_done)
