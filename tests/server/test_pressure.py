"""Every status of the outcome table, provoked in-process; cancellation and draining.

A Gate model holds its forward pass until the test opens it, so "the worker is busy" and
"these requests are queued" are states the test sets up, not timing it hopes for. The only
real-time wait is the 504 test's 50 ms deadline.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import MutableMapping
from typing import Any

import httpx
from batchserve_testmodels import Gate, Recorder, broken, poisoned
from server_helpers import build_app, client_for, embedding_model

from batchserve.config import BatchConfig
from batchserve.models.loader import LoadedModel
from batchserve.server import App, ModelSettings, ServerSettings
from support import wait_for


def gated(*, queue_size: int = 1, max_batch_size: int = 1) -> tuple[Gate, App]:
    """A Gate model served as ``g``, no wait, admission and prefetch off.

    Prefetch off: the queue holds exactly what a test sends behind the held pass.
    """
    gate = Gate()
    cfg = BatchConfig(
        max_batch_size=max_batch_size,
        max_wait_s=0.0,
        queue_size=queue_size,
        admission=False,
        prefetch=False,
    )
    return gate, build_app({"g": embedding_model(gate)}, batch={"g": cfg})


async def until(predicate: Any, what: str) -> None:
    """Wait for ``predicate`` (support.wait_for), failing with ``what`` after 10 s."""
    assert await wait_for(predicate), f"never happened: {what}"


def queue_depth(app: App, name: str = "g") -> int:
    batcher = app.registry.models[name].batcher
    assert batcher is not None
    return batcher.statistics().queue_depth


async def hold_and_queue_one(
    c: httpx.AsyncClient, gate: Gate, app: App
) -> tuple[asyncio.Task[httpx.Response], asyncio.Future[httpx.Response]]:
    """A request held in the model (one worker) and one queued behind it: the queue is full."""
    holder = await hold_worker(c, gate)
    queued = asyncio.ensure_future(c.post("/v1/embeddings", json={"input": "queued"}))
    await until(lambda: queue_depth(app) == 1, "one item queued")
    return holder, queued


async def hold_worker(c: httpx.AsyncClient, gate: Gate) -> asyncio.Task[httpx.Response]:
    """Start a request whose pass blocks in the gate; return once it is in the model."""
    task = asyncio.ensure_future(c.post("/v1/embeddings", json={"input": "holder"}))
    await asyncio.to_thread(gate.entered.wait, 5)
    return task


def check_refusal(r: httpx.Response, status: int, reason: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["x-reason"] == reason
    assert int(r.headers["retry-after"]) >= 1
    assert int(r.headers["retry-after-ms"]) >= 1
    error = r.json()["error"]
    if isinstance(error, dict):  # OpenAI's shape; KServe's is a plain message
        assert error["code"] == reason


async def test_queue_full_is_429_with_retry_after() -> None:
    gate, app = gated()
    async with client_for(app) as c:
        holder, queued = await hold_and_queue_one(c, gate, app)
        r = await c.post("/v1/embeddings", json={"input": "refused"})
        check_refusal(r, 429, "queue_full")
        gate.release()
        assert (await holder).status_code == 200
        assert (await queued).status_code == 200
    assert "refused" not in gate.seen


async def test_a_refusal_is_decided_from_the_head_without_reading_the_body() -> None:
    gate, app = gated()
    async with client_for(app) as c:
        holder, queued = await hold_and_queue_one(c, gate, app)
        read: list[str] = []

        async def receive() -> dict[str, Any]:
            read.append("body")
            return {"type": "http.request", "body": b'{"input": "x"}', "more_body": False}

        sent: list[MutableMapping[str, Any]] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/embeddings",
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"14")],
        }
        await app(scope, receive, send)
        assert sent[0]["status"] == 429
        assert dict(sent[0]["headers"])[b"x-reason"] == b"queue_full"
        assert read == []  # refused before a byte of the body was read
        gate.release()
        assert (await holder).status_code == 200
        assert (await queued).status_code == 200


async def test_a_deadline_passed_before_admission_is_504_and_never_computed() -> None:
    model = Recorder()
    app = build_app({"m": embedding_model(model)})
    async with client_for(app) as c:
        past = f"{time.time() - 1:.3f}"
        r = await c.post(
            "/v1/embeddings", json={"input": "late"}, headers={"X-Request-Deadline": past}
        )
        assert r.status_code == 504
        assert r.headers["x-reason"] == "deadline_exceeded"
        assert r.headers["server-timing"].startswith("total;dur=")
        metrics = (await c.get("/metrics")).text
    assert model.seen == []
    assert 'outcome="expired",reason="deadline_exceeded"} 1.0' in metrics


async def test_a_multi_input_request_is_refused_whole() -> None:
    gate, app = gated(queue_size=2)
    async with client_for(app) as c:
        holder = await hold_worker(c, gate)
        r = await c.post("/v1/embeddings", json={"input": ["x1", "x2", "x3"]})
        check_refusal(r, 429, "queue_full")
        await until(lambda: queue_depth(app) == 0, "the admitted inputs withdrawn")
        gate.release()
        await holder
    assert gate.seen == ["holder"]


async def test_infeasible_deadline_is_429_at_once() -> None:
    app = build_app({"slow": "synthetic:fixed=1s,per_item=0ms,dim=4"})
    async with client_for(app) as c:
        r = await c.post(
            "/v1/embeddings", json={"input": "x"}, headers={"X-Request-Timeout": "10ms"}
        )
        check_refusal(r, 429, "infeasible")
        model = app.registry.models["slow"].loaded
        assert model is not None
        assert model.fn.calls == 0  # type: ignore[union-attr]


async def test_not_ready_while_loading_is_503() -> None:
    loaded = threading.Event()

    def loader(spec: str) -> LoadedModel:
        loaded.wait(10)
        return embedding_model(Recorder())

    app = App(ServerSettings(models=(ModelSettings(name="m", spec="m"),)), loader=loader)
    async with client_for(app, wait=False) as c:
        check_refusal(await c.post("/v1/embeddings", json={"input": "x"}), 503, "not_ready")
        check_refusal(await c.get("/v2/health/ready"), 503, "not_ready")
        check_refusal(await c.get("/v2/models/m/ready"), 503, "not_ready")
        infer = {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
        check_refusal(await c.post("/v2/models/m/infer", json=infer), 503, "not_ready")
        assert (await c.get("/v2/health/live")).status_code == 200
        # TEI's and Infinity's /health: 503 until the models serve; /models lists it loading
        health = await c.get("/health")
        assert (health.status_code, health.json()["error_type"]) == (503, "unhealthy")
        (listed,) = (await c.get("/models")).json()["data"]
        assert (listed["state"], listed["capabilities"]) == ("loading", [])
        loaded.set()
        await app.wait_ready()
        r = await c.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 200, r.text


async def test_draining_is_503_and_accepted_work_finishes() -> None:
    gate, app = gated(queue_size=8)
    async with client_for(app) as c:
        holder, queued = await hold_and_queue_one(c, gate, app)
        app.begin_drain()  # what SIGTERM does at once; the drain itself is a task
        drain = asyncio.ensure_future(app.drain(5.0))
        check_refusal(await c.post("/v1/embeddings", json={"input": "late"}), 503, "draining")
        check_refusal(await c.get("/v2/health/ready"), 503, "draining")
        gate.release()
        await drain
        assert (await holder).status_code == 200
        q = await queued
        assert q.status_code == 200, q.text
        assert app.inflight == 0
    assert gate.seen == ["holder", "queued"]


async def test_deadline_passed_in_the_queue_is_504_and_never_computed() -> None:
    gate, app = gated()
    async with client_for(app) as c:
        holder = await hold_worker(c, gate)
        r = await c.post(
            "/v1/embeddings", json={"input": "expires"}, headers={"X-Request-Timeout": "0.05"}
        )
        assert r.status_code == 504
        assert r.headers["x-reason"] == "deadline_exceeded"
        assert r.json()["error"]["code"] == "deadline_exceeded"
        gate.release()
        await holder
    assert "expires" not in gate.seen


async def test_bad_deadline_header_is_422() -> None:
    async with client_for(build_app({"r": embedding_model(Recorder())})) as c:
        for bad in ("soon", "0", "-1s"):
            r = await c.post(
                "/v1/embeddings", json={"input": "x"}, headers={"X-Request-Timeout": bad}
            )
            assert r.status_code == 422, bad
            assert r.json()["error"]["param"] == "X-Request-Timeout"
        ok = await c.post(
            "/v1/embeddings", json={"input": "x"}, headers={"X-Request-Timeout": "250ms"}
        )
        assert ok.status_code == 200


async def test_model_error_is_422_for_the_failing_request_only() -> None:
    gate, app = gated(queue_size=8, max_batch_size=8)
    async with client_for(app) as c:
        holder = await hold_worker(c, gate)
        texts = ["good 1", "poison", "good 2"]
        tasks = [asyncio.ensure_future(c.post("/v1/embeddings", json={"input": t})) for t in texts]
        await until(lambda: queue_depth(app) == 3, "three items queued")
        gate.release()
        await holder
        good1, bad, good2 = [await t for t in tasks]
    assert good1.status_code == good2.status_code == 200
    assert good1.headers["x-batch-id"] == good2.headers["x-batch-id"]  # one pass, bisected
    assert bad.status_code == 422
    assert bad.headers["x-reason"] == "model_error"
    assert "poison" in bad.json()["error"]["message"]


async def test_model_error_on_kserve_and_a_broken_model_is_500() -> None:
    app = build_app(
        {"p": embedding_model(poisoned), "b": embedding_model(broken)},
        batch={"b": BatchConfig(max_bisect_calls=0)},
    )
    infer = {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["poison"]}]}
    async with client_for(app) as c:
        r = await c.post("/v2/models/p/infer", json=infer)
        assert r.status_code == 422
        assert r.headers["x-reason"] == "model_error"
        assert "poison" in r.json()["error"]
        r = await c.post("/v1/embeddings", json={"input": "x", "model": "b"})
        assert r.status_code == 500
        assert r.headers["x-reason"] == "internal"
        assert "contract" in r.json()["error"]["message"]


async def test_api_key_guards_inference_but_not_health_or_metrics() -> None:
    app = build_app({"r": embedding_model(Recorder())}, api_key="s3cret")
    infer = {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    async with client_for(app) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = await c.post("/v1/embeddings", json={"input": "x"}, headers=headers)
            assert r.status_code == 401
            assert r.headers["x-reason"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
            r = await c.post("/v2/models/r/infer", json=infer, headers=headers)
            assert r.status_code == 401
        assert (await c.get("/v1/models")).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert (await c.post("/v1/embeddings", json={"input": "x"}, headers=good)).is_success
        assert (await c.post("/v2/models/r/infer", json=infer, headers=good)).is_success
        for path in ("/v2/health/live", "/v2/health/ready", "/metrics", "/openapi.json"):
            assert (await c.get(path)).status_code == 200, path


async def test_a_client_that_leaves_while_queued_is_never_computed() -> None:
    gate, app = gated(queue_size=8)
    async with client_for(app) as c:
        holder = await hold_worker(c, gate)
        body = b'{"input": "leaver"}'
        left = asyncio.Event()
        sent: list[MutableMapping[str, Any]] = []
        first = True

        async def receive() -> dict[str, Any]:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": body, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/embeddings",
            "headers": [(b"content-type", b"application/json")],
        }
        leaver = asyncio.ensure_future(app(scope, receive, send))
        await until(lambda: queue_depth(app) == 1, "the leaver queued")
        left.set()
        await asyncio.wait_for(leaver, 5)
        assert sent == []
        assert queue_depth(app) == 0
        gate.release()
        assert (await holder).status_code == 200
        batcher = app.registry.models["g"].batcher
        assert batcher is not None
        assert batcher.statistics().counters.cancelled == 1
        metrics = (await c.get("/metrics")).text
    assert gate.seen == ["holder"]
    assert 'batchserve_requests_total{model="g",outcome="cancelled",reason="cancelled"} 1.0' in (
        metrics
    )
