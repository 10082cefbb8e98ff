"""Metrics, the OpenAPI document, the docs page, and the manual's status table."""

from __future__ import annotations

import importlib.util
import pathlib
import re

from batchserve_testmodels import Recorder
from server_helpers import build_app, client_for, embedding_model

from batchserve.errors import DeadlineExceeded, ModelError, NotReady, OutputMismatch, QueueFull
from batchserve.server.exchange import SERVER_TIMING, TIMING_HEADERS
from batchserve.server.protocols.window import TRUNCATED_HEADER
from batchserve.server.statuses import GRPC_TABLE, STATUS_TABLE, ApiError, from_exception

ROOT = pathlib.Path(__file__).resolve().parents[3]


async def test_metrics_report_requests_batches_queue_and_cost_per_model() -> None:
    app = build_app({"m": embedding_model(Recorder())})
    async with client_for(app) as c:
        await c.post("/v1/embeddings", json={"input": ["a", "b"]})
        await c.post("/v1/embeddings", json={"input": []})
        r = await c.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for needle in (
        'batchserve_requests_total{model="m",outcome="ok",reason="ok"} 1.0',
        'batchserve_requests_total{model="_unknown",outcome="invalid",reason="invalid"} 1.0',
        'batchserve_request_duration_seconds_count{model="m",protocol="openai"} 1.0',
        'batchserve_queue_wait_seconds_count{model="m"} 2.0',
        'batchserve_batch_size_count{model="m"}',
        'batchserve_forward_seconds_count{model="m"}',
        'batchserve_items_total{model="m",outcome="ok"} 2.0',
        'batchserve_queue_depth{model="m"} 0.0',
        'batchserve_cost_fixed_seconds{model="m"}',
        'batchserve_cost_per_item_seconds{model="m"}',
        'batchserve_model_ready{model="m"} 1.0',
    ):
        assert needle in text, needle
    # What monitoring tools use badly: empty label values and *_created series.
    assert '=""' not in text
    assert "_created" not in text


async def test_openapi_lists_every_route_the_app_serves() -> None:
    app = build_app({"m": embedding_model(Recorder())})
    async with client_for(app) as c:
        spec = (await c.get("/openapi.json")).json()
        docs = await c.get("/docs")
    assert spec["openapi"].startswith("3.1")
    static = set(app.routes.static)
    dynamic = {"/v1/models/{name}", "/v2/models/{name}", "/v2/models/{name}/ready",
               "/v2/models/{name}/infer", "/v2/models/{name}/config",
               "/v2/models/{name}/stats"}  # fmt: skip
    assert set(spec["paths"]) == static | dynamic
    for path, methods in app.routes.static.items():
        assert set(spec["paths"][path]) == {m.lower() for m in methods}, path
    post = spec["paths"]["/v1/embeddings"]["post"]
    assert post["parameters"][0]["name"] == "X-Request-Timeout"
    assert set(post["responses"]["200"]["headers"]) == {
        *TIMING_HEADERS,
        SERVER_TIMING,
        TRUNCATED_HEADER,
    }
    assert {"400", "401", "404", "413", "422", "429", "500", "503", "504"} <= set(post["responses"])
    assert docs.status_code == 200
    assert docs.headers["content-type"].startswith("text/html")
    assert "X-Request-Timeout" in docs.text
    assert "<script" not in docs.text
    # markdown's inline code is set as code, never shown as raw backticks
    assert "`" not in docs.text
    assert "<code>openai</code>" in docs.text


def test_the_manuals_status_table_is_the_servers() -> None:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    table = hooks.render_statuses()
    rows = re.findall(r"^\| `(\w+)` \| (\d{3}) \| `(\w+)` \|", table, re.M)
    assert {r: s for r, s, _ in rows} == {r: str(s) for r, (s, _) in STATUS_TABLE.items()}
    assert {r: code for r, _, code in rows} == GRPC_TABLE


def test_core_errors_map_through_the_one_table() -> None:
    cases = [
        (QueueFull("full", retry_after_s=0.2), 429, "queue_full"),
        (NotReady("loading"), 503, "not_ready"),
        (DeadlineExceeded("late"), 504, "deadline_exceeded"),
        (ModelError("bad input"), 422, "model_error"),
        (OutputMismatch("2 for 3"), 500, "internal"),
        (RuntimeError("bug"), 500, "internal"),
    ]
    for exc, status, reason in cases:
        err = from_exception(exc)
        assert (err.status, err.reason) == (status, reason)
    headers = dict(from_exception(QueueFull("full", retry_after_s=0.2)).headers())
    assert headers[b"retry-after"] == b"1"
    assert headers[b"retry-after-ms"] == b"200"
    assert dict(ApiError("draining", "x", retry_after_s=2.5).headers())[b"retry-after"] == b"3"
