"""The gRPC transport: the real client (tritonclient.grpc) against the same app as HTTP.

In-process tests start the app and its gRPC transport on the test's loop, on port 0 of
127.0.0.1, and call it with ``tritonclient.grpc.aio`` or a bare grpcio channel (for trailing
metadata, hostile bytes, and typed contents, which tritonclient never sends). The slow tests
run ``batchserve serve --grpc-port 0`` in a subprocess. The messages' decoding under hostile
bytes is tested in ``tests/server/protocols/test_kserve_grpc.py``, the reasons' gRPC codes in
``tests/server/test_statuses.py``, the load generator over gRPC in
``tests/loadgen/test_grpc_load.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import re
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import grpc.aio
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tc
import tritonclient.grpc.aio as tc_aio
from batchserve_testmodels import Gate, Recorder, double, poisoned, upper, vector
from server_helpers import build_app, client_for, embedding_model, server_process
from tritonclient.utils import InferenceServerException

from batchserve.config import BatchConfig
from batchserve.errors import ConfigError
from batchserve.models.loader import LoadedModel
from batchserve.server import App, ModelSettings, RequestLimits, ServerSettings
from batchserve.server.protocols.proto import grpc_service_pb2 as pb
from batchserve.server.transport.grpc import CALL_MARGIN, GrpcTransport, grpc_timeout, max_calls
from support import wait_for

ONE_AT_A_TIME = BatchConfig(
    max_batch_size=1, max_wait_s=0.0, queue_size=1, admission=False, prefetch=False
)
INFER = "/inference.GRPCInferenceService/ModelInfer"


@contextlib.asynccontextmanager
async def serving(app: App, *, wait: bool = True) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """The app over HTTP (in-process) and gRPC (127.0.0.1, a free port): address, client."""
    async with client_for(app, wait=wait) as http:
        transport = GrpcTransport(app)
        port = await transport.start("127.0.0.1", 0)
        try:
            yield f"127.0.0.1:{port}", http
        finally:
            await transport.stop(None)


async def call(
    address: str,
    request: pb.ModelInferRequest | bytes,
    *,
    metadata: Sequence[tuple[str, str]] = (),
    deadline_s: float | None = None,
) -> tuple[pb.ModelInferResponse, dict[str, str]]:
    """One ModelInfer on a bare channel: the response and its trailing metadata."""
    async with grpc.aio.insecure_channel(address) as channel:
        method: grpc.aio.UnaryUnaryMultiCallable[bytes, pb.ModelInferResponse] = (
            channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
        )
        body = request if isinstance(request, bytes) else request.SerializeToString()
        rpc = method(body, metadata=tuple(metadata), timeout=deadline_s)
        response = await rpc
        trailing = await rpc.trailing_metadata()
    return response, {k: str(v) for k, v in (trailing or ())}


async def refused(
    address: str, request: pb.ModelInferRequest | bytes, **kw: Any
) -> grpc.aio.AioRpcError:
    """The error of a ModelInfer that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(address, request, **kw)
    return info.value


def texts(model: str, *values: str, **kw: Any) -> pb.ModelInferRequest:
    """A ModelInfer of BYTES texts as typed contents (tritonclient sends raw contents)."""
    request = pb.ModelInferRequest(model_name=model, **kw)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(values)])
    tensor.contents.bytes_contents.extend(v.encode() for v in values)
    return request


def metadata_of(error: grpc.aio.AioRpcError) -> dict[str, str]:
    return {k: str(v) for k, v in (error.trailing_metadata() or ())}


def check_refusal(error: grpc.aio.AioRpcError, code: grpc.StatusCode, reason: str) -> None:
    assert error.code() == code, error.details()
    md = metadata_of(error)
    assert md["x-reason"] == reason
    assert int(md["retry-after-ms"]) >= 1
    assert int(md["retry-after"]) >= 1


def queue_depth(app: App, name: str) -> int:
    batcher = app.registry.models[name].batcher
    assert batcher is not None
    return batcher.statistics().queue_depth


def held_app() -> tuple[Gate, App]:
    """An app serving ``g``, one item a pass, whose passes wait at the returned gate."""
    gate = Gate()
    cfg = BatchConfig(
        max_batch_size=1, max_wait_s=0.0, queue_size=8, admission=False, prefetch=False
    )
    return gate, build_app({"g": embedding_model(gate)}, batch={"g": cfg})


# -- the deadline on the wire -----------------------------------------------------------------


def test_a_deadline_is_written_in_the_finest_unit_that_fits() -> None:
    assert grpc_timeout(0.05) == b"50000000n"
    assert grpc_timeout(0.25) == b"250000u"
    assert grpc_timeout(2.5) == b"2500000u"
    assert grpc_timeout(1000.0) == b"1000000m"
    assert grpc_timeout(-1.0) == b"0n"
    assert grpc_timeout(1e12) == b"99999999H"


# -- the service through tritonclient ---------------------------------------------------------


async def test_health_metadata_and_triton_s_extensions() -> None:
    app = build_app(
        {"emb": embedding_model(Recorder(), dim=4), "double": LoadedModel(spec="d", fn=double)}
    )
    async with serving(app) as (address, _):
        client = tc_aio.InferenceServerClient(address)
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("emb")
            meta = await client.get_server_metadata(as_json=True)
            assert meta["name"] == "batchserve"
            assert "statistics" in meta["extensions"]
            model = await client.get_model_metadata("emb", as_json=True)
            assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1", "1"]}]
            assert model["outputs"][0]["shape"] == ["-1", "4"]
            config = (await client.get_model_config("emb", as_json=True))["config"]
            assert config["max_batch_size"] == 32
            assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "2000"
            assert config["input"][0]["data_type"] == "TYPE_STRING"
            index = await client.get_model_repository_index(as_json=True)
            assert [m["name"] for m in index["models"]] == ["emb", "double"]
            assert {m["state"] for m in index["models"]} == {"READY"}
            stats = await client.get_inference_statistics(as_json=True)
            assert [s["name"] for s in stats["model_stats"]] == ["emb", "double"]
            with pytest.raises(InferenceServerException) as info:
                await client.get_model_config("nope")
            assert info.value.status() == "StatusCode.NOT_FOUND"
            assert "served: emb, double" in info.value.message()
            with pytest.raises(InferenceServerException) as info:
                await client.get_model_metadata("emb", model_version="2")
            assert info.value.status() == "StatusCode.NOT_FOUND"
        finally:
            await client.close()


async def test_texts_in_embeddings_out_with_statistics_and_metrics() -> None:
    app = build_app({"emb": embedding_model(Recorder(), dim=4)})
    async with serving(app) as (address, http):
        client = tc_aio.InferenceServerClient(address)
        try:
            x = tc_aio.InferInput("text", [2, 1], "BYTES")
            x.set_data_from_numpy(np.array([[b"hello"], [b"world"]], dtype=object))
            result = await client.infer("emb", [x], request_id="r1")
            out = result.as_numpy("embedding")
            assert out is not None
            np.testing.assert_allclose(out, [vector("hello"), vector("world")], rtol=1e-6)
            assert result.get_response().id == "r1"
            stats = (await client.get_inference_statistics("emb", as_json=True))["model_stats"][0]
            assert stats["inference_stats"]["success"]["count"] == "1"
            assert stats["inference_count"] == "2"
        finally:
            await client.close()
        metrics = (await http.get("/metrics")).text
    assert 'batchserve_requests_total{model="emb",outcome="ok",reason="ok"} 1.0' in metrics
    assert 'protocol="grpc"' in metrics


async def test_typed_contents_and_raw_contents_give_the_same_answer() -> None:
    app = build_app(
        {"double": LoadedModel(spec="d", fn=double), "upper": LoadedModel(spec="u", fn=upper)}
    )
    async with serving(app) as (address, _):
        typed = pb.ModelInferRequest(model_name="double")
        t = typed.inputs.add(name="x", datatype="FP32", shape=[2, 3])
        t.contents.fp32_contents.extend([1, 2, 3, 4, 5, 6])
        raw = pb.ModelInferRequest(model_name="double")
        raw.inputs.add(name="x", datatype="FP32", shape=[2, 3])
        raw.raw_input_contents.append(np.arange(1, 7, dtype="<f4").tobytes())
        answers = []
        for request in (typed, raw):
            response, _ = await call(address, request)
            assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
                ("output", "FP32", [2, 3])
            ]
            answers.append(response.raw_output_contents[0])
        assert answers[0] == answers[1]
        x = np.frombuffer(answers[0], dtype="<f4").reshape(2, 3)
        np.testing.assert_array_equal(x, np.arange(1, 7).reshape(2, 3) * 2)

        ints = pb.ModelInferRequest(model_name="double")
        t = ints.inputs.add(name="n", datatype="INT8", shape=[2])
        t.contents.int_contents.extend([7, -8])
        response, _ = await call(address, ints)
        assert response.outputs[0].datatype == "INT8"
        assert np.frombuffer(response.raw_output_contents[0], dtype="i1").tolist() == [14, -16]
        t.contents.int_contents[0] = 300
        error = await refused(address, ints)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "contents.int_contents is not INT8" in str(error.details())

        response, _ = await call(address, texts("upper", "ab", "c"))
        assert response.outputs[0].datatype == "BYTES"
        assert response.raw_output_contents[0] == b"\x02\x00\x00\x00AB\x01\x00\x00\x00C"


async def test_the_timing_facts_come_as_trailing_metadata() -> None:
    app = build_app({"emb": embedding_model(Recorder())})
    async with serving(app) as (address, _):
        _, md = await call(address, texts("emb", "a", "b"))
    assert md["x-batch-size"] == "2,2"
    assert set(md) >= {"x-queue-wait-s", "x-batch-id", "x-forward-s", "server-timing"}
    assert md["server-timing"].startswith("total;dur=")


# -- statuses ---------------------------------------------------------------------------------


async def test_bad_input_is_invalid_argument_naming_the_field_and_rule() -> None:
    app = build_app(
        {"emb": embedding_model(Recorder()), "double": LoadedModel(spec="d", fn=double)}
    )
    async with serving(app) as (address, _):
        error = await refused(address, texts("emb", "a", ""))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "text[1] must not be empty"
        assert metadata_of(error)["x-reason"] == "invalid"

        request = pb.ModelInferRequest(model_name="double")
        t = request.inputs.add(name="x", datatype="FP32", shape=[2])
        t.contents.fp32_contents.extend([1.0])
        error = await refused(address, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "shape [2] holds 2 elements, contents.fp32_contents has 1" in str(error.details())

        request.raw_input_contents.append(b"\x00" * 3)
        error = await refused(address, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "needs 8 bytes" in str(error.details())

        error = await refused(address, b"\xff\xff\xff not protobuf")
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert metadata_of(error)["x-reason"] == "malformed"

        error = await refused(address, texts("nope", "a"))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        error = await refused(address, texts("emb", "a", model_version="7"))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "no version '7'" in str(error.details())


async def test_the_key_is_read_from_authorization_metadata() -> None:
    app = build_app({"emb": embedding_model(Recorder())}, api_key="sesame")
    async with serving(app) as (address, _):
        error = await refused(address, texts("emb", "a"))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        error = await refused(address, texts("emb", "a"), metadata=[("authorization", "Bearer x")])
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        await call(address, texts("emb", "a"), metadata=[("authorization", "Bearer sesame")])
        client = tc_aio.InferenceServerClient(address)
        try:  # health and metadata take no key, as over HTTP
            assert await client.is_model_ready("emb")
        finally:
            await client.close()


async def test_a_full_queue_is_resource_exhausted_and_draining_unavailable() -> None:
    gate = Gate()
    app = build_app({"g": embedding_model(gate)}, batch={"g": ONE_AT_A_TIME})
    async with serving(app) as (address, _):
        holder = asyncio.ensure_future(call(address, texts("g", "holder")))
        await asyncio.to_thread(gate.entered.wait, 5)
        queued = asyncio.ensure_future(call(address, texts("g", "queued")))
        assert await wait_for(lambda: queue_depth(app, "g") == 1)
        check_refusal(
            await refused(address, texts("g", "x")),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "queue_full",
        )
        app.begin_drain()
        check_refusal(
            await refused(address, texts("g", "x")), grpc.StatusCode.UNAVAILABLE, "draining"
        )
        gate.release()
        await holder
        await queued  # accepted before the drain: answered


async def test_calls_past_the_bound_are_refused_by_grpcio_and_never_counted() -> None:
    gate, app = held_app()
    async with client_for(app) as http:
        transport = GrpcTransport(app, max_concurrent_calls=3)
        address = f"127.0.0.1:{await transport.start('127.0.0.1', 0)}"
        try:
            holder = asyncio.ensure_future(call(address, texts("g", "holder")))
            await asyncio.to_thread(gate.entered.wait, 5)
            queued = [asyncio.ensure_future(call(address, texts("g", f"q{i}"))) for i in range(2)]
            assert await wait_for(lambda: queue_depth(app, "g") == 2)
            # Three calls in flight: a burst past the bound is grpcio's to refuse, at once.
            burst = await asyncio.gather(*(refused(address, texts("g", "x")) for _ in range(5)))
            assert {e.code() for e in burst} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert all("x-reason" not in metadata_of(e) for e in burst)
            assert app.metrics.received == 3
            gate.release()
            await asyncio.gather(holder, *queued)
            # Healthy afterwards: a call is served, and the books hold only what it admitted.
            await call(address, texts("g", "after"))
            metrics = (await http.get("/metrics")).text
        finally:
            await transport.stop(None)
    assert sorted(gate.seen) == sorted(["holder", "q0", "q1", "after"])
    assert app.metrics.received == 4
    assert "batchserve_requests_received_total 4.0" in metrics
    assert 'batchserve_requests_total{model="g",outcome="ok",reason="ok"} 4.0' in metrics
    assert app.inflight == 0


def test_the_bound_is_the_models_queues_and_passes_plus_a_margin() -> None:
    app = build_app(
        {
            "a": embedding_model(Recorder()),
            "b": embedding_model(Recorder()),
        },
        batch={
            "a": BatchConfig(queue_size=100, max_batch_size=8, workers=2),
            "b": BatchConfig(queue_size=10, max_batch_size=4),
        },
    )
    assert max_calls(app.registry) == (100 + 2 * 2 * 8) + (10 + 2 * 1 * 4) + CALL_MARGIN
    with pytest.raises(ConfigError, match="max_concurrent_calls must be an integer >= 1, got 0"):
        GrpcTransport(app, max_concurrent_calls=0)


async def test_a_call_whose_deadline_passed_inside_grpcio_is_never_computed() -> None:
    # A call that waited in grpcio until its gRPC deadline passed reaches the handler with
    # no time left: it is answered DEADLINE_EXCEEDED and never reaches the queue.
    recorder = Recorder()
    app = build_app({"r": embedding_model(recorder)})
    async with client_for(app):
        transport = GrpcTransport(app)
        context = _LateContext()
        body = texts("r", "late").SerializeToString()
        with pytest.raises(_Aborted) as info:
            await transport.model_infer(body, context)  # type: ignore[arg-type]
        batcher = app.registry.models["r"].batcher
        assert batcher is not None
        counters = batcher.statistics().counters
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert dict(info.value.metadata)["x-reason"] == "deadline_exceeded"
    assert recorder.seen == []
    assert counters.received == 0
    assert app.metrics.received == 1
    assert app.inflight == 0


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, metadata: Sequence[tuple[str, str]]) -> None:
        self.code, self.metadata = code, metadata


class _LateContext:
    """The part of a grpcio context ``model_infer`` reads, for a call already past due."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-request-timeout", "10"),)

    def time_remaining(self) -> float:
        return -0.05

    async def abort(
        self, code: grpc.StatusCode, details: str, metadata: Sequence[tuple[str, str]]
    ) -> None:
        raise _Aborted(code, metadata)


async def test_a_loading_model_is_unavailable() -> None:
    loaded = threading.Event()

    def loader(spec: str) -> LoadedModel:
        loaded.wait(10)
        return embedding_model(Recorder())

    settings = ServerSettings(models=(ModelSettings(name="slow", spec="slow"),))
    app = App(settings, loader=loader)
    try:
        async with serving(app, wait=False) as (address, _):
            check_refusal(
                await refused(address, texts("slow", "x")), grpc.StatusCode.UNAVAILABLE, "not_ready"
            )
            client = tc_aio.InferenceServerClient(address)
            try:
                assert not await client.is_server_ready()
                assert not await client.is_model_ready("slow")
            finally:
                await client.close()
            loaded.set()
    finally:
        loaded.set()


async def test_the_tightest_deadline_wins_and_is_deadline_exceeded() -> None:
    gate, app = held_app()
    async with serving(app) as (address, _):
        holder = asyncio.ensure_future(call(address, texts("g", "holder")))
        await asyncio.to_thread(gate.entered.wait, 5)
        # parameters.timeout (50 ms) is tighter than the call's own (10 s): the server answers.
        request = texts("g", "late")
        request.parameters["timeout"].int64_param = 50_000
        error = await refused(address, request, deadline_s=10)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert metadata_of(error)["x-reason"] == "deadline_exceeded"
        # The call's own deadline (50 ms) is tighter than parameters.timeout (10 s).
        request.parameters["timeout"].int64_param = 10_000_000
        error = await refused(address, request, deadline_s=0.05)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await wait_for(lambda: queue_depth(app, "g") == 0)
        gate.release()
        await holder
    assert gate.seen == ["holder"]


async def test_a_model_error_fails_only_its_call() -> None:
    app = build_app(
        {"p": embedding_model(poisoned)},
        batch={"p": BatchConfig(max_batch_size=8, max_wait_s=0.05)},
    )
    async with serving(app) as (address, _):
        good, bad = await asyncio.gather(
            call(address, texts("p", "fine")),
            refused(address, texts("p", "poison")),
        )
    assert good[0].outputs[0].shape == [1, 4]
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert metadata_of(bad)["x-reason"] == "model_error"
    assert "cannot embed 'poison'" in str(bad.details())


async def test_a_cancelled_call_never_reaches_the_model() -> None:
    gate, app = held_app()
    async with serving(app) as (address, http):
        holder = asyncio.ensure_future(call(address, texts("g", "holder")))
        await asyncio.to_thread(gate.entered.wait, 5)
        leaver = asyncio.ensure_future(call(address, texts("g", "leaver")))
        assert await wait_for(lambda: queue_depth(app, "g") == 1)
        leaver.cancel()
        assert await wait_for(lambda: queue_depth(app, "g") == 0)
        gate.release()
        await holder
        batcher = app.registry.models["g"].batcher
        assert batcher is not None
        assert await wait_for(lambda: batcher.statistics().counters.cancelled == 1)
        metrics = (await http.get("/metrics")).text
    assert gate.seen == ["holder"]
    assert 'batchserve_requests_total{model="g",outcome="cancelled",reason="cancelled"} 1.0' in (
        metrics
    )
    assert app.inflight == 0


async def test_a_message_over_the_size_limit_is_refused_by_grpcio() -> None:
    app = build_app({"emb": embedding_model(Recorder())}, limits=RequestLimits(max_body_bytes=1024))
    async with serving(app) as (address, _):
        error = await refused(address, texts("emb", "x" * 2000))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await call(address, texts("emb", "x" * 500))


# -- a real server ----------------------------------------------------------------------------


@pytest.mark.slow
def test_tritonclient_sync_and_callbacks_then_sigterm_drains_both() -> None:
    args = ["--model", "m=synthetic:fixed=100ms", "--grpc-port", "0", "--max-batch-size", "4"]
    with server_process(args) as server:
        assert server.grpc is not None
        client = tc.InferenceServerClient(server.grpc)
        assert client.is_server_ready()
        x = tc.InferInput("text", [1], "BYTES")
        x.set_data_from_numpy(np.array([b"hi"], dtype=object))
        out = client.infer("m", [x]).as_numpy("embedding")
        assert out is not None
        assert out.shape == (1, 8)
        with pytest.raises(InferenceServerException) as info:
            client.infer("m", [x], model_version="2")
        assert info.value.status() == "StatusCode.NOT_FOUND"

        done: list[Any] = []
        lock = threading.Condition()

        def callback(result: Any, error: Any) -> None:
            with lock:
                done.append(error if error is not None else result.as_numpy("embedding").shape)
                lock.notify_all()

        for _ in range(8):
            client.async_infer("m", [x], callback)
        # Every call is accepted before the signal: counted received (2 calls before these),
        # it is admitted in the same step.
        assert wait_for_sync(lambda: received(server.url) == 10)
        server.proc.send_signal(signal.SIGTERM)
        with lock:
            assert lock.wait_for(lambda: len(done) == 8, 10)
        assert done == [(1, 8)] * 8
        code, err = server.wait(20)
        client.close()
    assert code == 0, err
    assert "draining" in err


def received(url: str) -> int:
    return int(httpx.get(url + "/status", timeout=5).json()["received"])


def wait_for_sync(predicate: Any, timeout_s: float = 10) -> bool:
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if predicate():
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.01)
    return False


@pytest.mark.slow
def test_the_ready_line_names_the_grpc_address() -> None:
    with server_process(["--model", "m=synthetic", "--grpc-port", "0"]) as server:
        assert server.grpc is not None
        host, port = server.grpc.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert int(port) > 0
        server.stop()


# -- TLS --------------------------------------------------------------------------------------


def self_signed(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A certificate for 127.0.0.1 and localhost, and its key, made here: (cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return write_pem(cert, key, directory / "cert.pem", directory / "key.pem")


def write_pem(
    cert: Any, key: Any, cert_path: pathlib.Path, key_path: pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path]:
    """Write a certificate and its (unencrypted) private key as PEM: (cert_path, key_path)."""
    from cryptography.hazmat.primitives import serialization

    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.mark.slow
# geventhttpclient (under tritonclient.http) checks the host name with ssl.match_hostname.
@pytest.mark.filterwarnings("ignore:ssl.match_hostname:DeprecationWarning")
def test_tls_on_both_transports_with_the_real_clients(tmp_path: pathlib.Path) -> None:
    import ssl

    import openai
    import tritonclient.http as th

    cert, key = self_signed(tmp_path)
    args = ["--model", "m=synthetic", "--grpc-port", "0"]
    args += ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    with server_process(args) as server:
        assert server.url.startswith("https://127.0.0.1:")
        assert server.grpc is not None
        text = np.array([b"hi"], dtype=object)

        grpc_client = tc.InferenceServerClient(server.grpc, ssl=True, root_certificates=str(cert))
        x = tc.InferInput("text", [1], "BYTES")
        x.set_data_from_numpy(text)
        out = grpc_client.infer("m", [x]).as_numpy("embedding")
        assert out is not None
        assert out.shape == (1, 8)
        grpc_client.close()

        http_client = th.InferenceServerClient(
            server.url.removeprefix("https://"),
            ssl=True,
            ssl_context_factory=lambda: ssl.create_default_context(cafile=str(cert)),
        )
        y = th.InferInput("text", [1], "BYTES")
        y.set_data_from_numpy(text)
        out = http_client.infer("m", [y]).as_numpy("embedding")
        assert out is not None
        assert out.shape == (1, 8)
        http_client.close()

        verify = ssl.create_default_context(cafile=str(cert))
        with openai.DefaultHttpxClient(verify=verify) as h:
            ai = openai.OpenAI(base_url=server.url + "/v1", api_key="-", http_client=h)
            assert len(ai.embeddings.create(model="m", input="hi").data[0].embedding) == 8
        assert httpx.get(server.url + "/v2/health/live", verify=verify).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + "/v2/health/live")  # not trusted without the cert
        code, err = server.stop()
    assert code == 0, err


def signed_client(
    directory: pathlib.Path, ca: tuple[pathlib.Path, pathlib.Path]
) -> tuple[pathlib.Path, pathlib.Path]:
    """A client certificate signed by the CA ``(cert, key)``, and its key: (cert, key)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca[0].read_bytes())
    ca_key = serialization.load_pem_private_key(ca[1].read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a client")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(exist_ok=True)
    return write_pem(cert, key, directory / "client.pem", directory / "client-key.pem")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:ssl.match_hostname:DeprecationWarning")
def test_client_certificates_signed_by_the_ca_are_required_on_both(
    tmp_path: pathlib.Path,
) -> None:
    import ssl

    cert, key = self_signed(tmp_path)
    (tmp_path / "ca").mkdir()
    (tmp_path / "rogue").mkdir()
    ca = self_signed(tmp_path / "ca")  # the clients' authority, not the server's
    client_cert, client_key = signed_client(tmp_path / "client", ca)
    rogue_cert, rogue_key = self_signed(tmp_path / "rogue")  # signed by no one we trust
    args = ["--model", "m=synthetic", "--grpc-port", "0"]
    args += ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    with server_process([*args, "--ssl-ca-certs", str(ca[0])]) as server:
        assert server.grpc is not None
        x = tc.InferInput("text", [1], "BYTES")
        x.set_data_from_numpy(np.array([b"hi"], dtype=object))

        def grpc_infer(pair: tuple[pathlib.Path, pathlib.Path] | None) -> Any:
            client = tc.InferenceServerClient(
                server.grpc,
                ssl=True,
                root_certificates=str(cert),
                private_key=None if pair is None else str(pair[1]),
                certificate_chain=None if pair is None else str(pair[0]),
            )
            try:
                return client.infer("m", [x], client_timeout=10).as_numpy("embedding")
            finally:
                client.close()

        assert grpc_infer((client_cert, client_key)).shape == (1, 8)
        for pair in (None, (rogue_cert, rogue_key)):
            with pytest.raises(InferenceServerException) as info:
                grpc_infer(pair)
            assert info.value.status() == "StatusCode.UNAVAILABLE", info.value

        def https(pair: tuple[pathlib.Path, pathlib.Path] | None) -> httpx.Response:
            context = ssl.create_default_context(cafile=str(cert))
            if pair is not None:
                context.load_cert_chain(str(pair[0]), str(pair[1]))
            return httpx.get(server.url + "/v2/health/live", verify=context, timeout=10)

        assert https((client_cert, client_key)).status_code == 200
        for pair in (None, (rogue_cert, rogue_key)):
            with pytest.raises(httpx.TransportError):
                https(pair)
        code, err = server.stop()
    assert code == 0, err


# -- ModelStreamInfer -------------------------------------------------------------------------


async def test_a_stream_s_requests_batch_together_and_each_is_answered() -> None:
    recorder = Recorder()
    app = build_app(
        {"emb": embedding_model(recorder)},
        batch={"emb": BatchConfig(max_batch_size=3, max_wait_s=0.2)},
    )
    async with serving(app) as (address, http):
        client = tc_aio.InferenceServerClient(address)

        async def requests() -> AsyncIterator[dict[str, Any]]:
            for i, text in enumerate(["a", "b", "", "nope", "c"]):
                x = tc_aio.InferInput("text", [1], "BYTES")
                x.set_data_from_numpy(np.array([text.encode()], dtype=object))
                model = "nope" if text == "nope" else "emb"
                yield {"model_name": model, "inputs": [x], "request_id": str(i)}

        answers: dict[str, Any] = {}
        errors: list[str] = []
        try:
            async for result, error in client.stream_infer(requests()):
                if error is not None:
                    errors.append(error.message())
                else:
                    answers[result.get_response().id] = result.as_numpy("embedding")
        finally:
            await client.close()
        metrics = (await http.get("/metrics")).text
    assert sorted(answers) == ["0", "1", "4"]
    np.testing.assert_allclose(answers["4"], [vector("c")], rtol=1e-6)
    assert sorted(errors) == [
        "model 'nope' is not served here; served: emb",
        "text[0] must not be empty",
    ]
    assert sorted(recorder.seen) == ["a", "b", "c"]
    # One pass: the stream's requests batched together (within the 200 ms max wait).
    assert [sorted(b) for b in recorder.batches] == [["a", "b", "c"]]
    assert 'batchserve_requests_total{model="emb",outcome="ok",reason="ok"} 3.0' in metrics
    assert app.inflight == 0


async def test_cancelling_a_stream_cancels_its_queued_requests() -> None:
    gate, app = held_app()
    async with serving(app) as (address, _):
        holder = asyncio.ensure_future(call(address, texts("g", "holder")))
        await asyncio.to_thread(gate.entered.wait, 5)
        async with grpc.aio.insecure_channel(address) as channel:
            stream: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer"
            )
            rpc = stream()
            await rpc.write(texts("g", "one").SerializeToString())
            await rpc.write(texts("g", "two").SerializeToString())
            assert await wait_for(lambda: queue_depth(app, "g") == 2)
            rpc.cancel()
            assert await wait_for(lambda: queue_depth(app, "g") == 0)
        gate.release()
        await holder
        assert await wait_for(lambda: app.inflight == 0)
    assert gate.seen == ["holder"]


@pytest.mark.slow
def test_perf_analyzer_over_grpc_unary_and_streaming() -> None:
    from batchserve_testing.tools import find_perf_analyzer

    binary, env = find_perf_analyzer()
    model = "synthetic"
    args = ["--model", "synthetic:fixed=2ms,per_item=0.1ms", "--max-wait", "1ms"]
    with server_process([*args, "--grpc-port", "0"]) as server:
        assert server.grpc is not None
        for extra in ([], ["--streaming"]):
            cmd = [
                binary,
                "-m", model,
                "-u", server.grpc,
                "-i", "grpc",
                "--request-rate-range", "100",
                "--measurement-interval", "400",
                "--stability-percentage", "60",
                "--max-trials", "6",
                *extra,
            ]  # fmt: skip
            done = subprocess.run(
                cmd, capture_output=True, text=True, env=env, timeout=60, check=False
            )
            out = done.stdout + done.stderr
            assert done.returncode == 0, out
            found = re.search(r"Successful request count: (\d+)", out)
            assert found is not None, out
            assert int(found.group(1)) > 0
            # The server's side comes from the statistics extension, over gRPC too.
            assert re.search(r"queue \d+ usec \+ compute input \d+ usec", out), out
        requests = httpx.get(server.url + "/status").json()["models"][model]["requests"]
        assert requests["ok"] == sum(requests.values())  # none refused or failed
        code, err = server.stop()
    assert code == 0, err
