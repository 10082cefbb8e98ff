"""OpenTelemetry spans (``--otel``): one per request, one per pass linking its requests.

The spans go to an in-memory exporter; each request span must carry what the response's
own headers told the client (queue wait, batch id, batch size, forward time), each pass
span must link exactly the requests it served, and with tracing off nothing of
OpenTelemetry is even imported.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import httpx
import pytest
from batchserve_testmodels import poisoned
from server_helpers import embedding_model, server_process

from batchserve.config import BatchConfig
from batchserve.errors import ConfigError
from batchserve.server import App, ModelSettings, ServerSettings

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_requests_and_passes_become_linked_spans() -> None:
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = ModelSettings(name="emb", spec="emb", batch=BatchConfig(max_wait_s=0.01))
    app = App(
        ServerSettings(models=(model,), otel=True),
        loader=lambda spec: embedding_model(poisoned, dim=4),
        tracer=provider.get_tracer("test"),
    )

    async def main() -> list[httpx.Response]:
        await app.start()
        await app.wait_ready()
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
                bodies: list[Any] = [{"input": f"t{i}"} for i in range(3)]
                bodies += [{"input": ["a", "b"]}, {"input": "poison"}]
                return list(
                    await asyncio.gather(*(c.post("/v1/embeddings", json=b) for b in bodies))
                )
        finally:
            await app.stop()

    responses = await main()
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 422]
    spans: list[Any] = list(exporter.get_finished_spans())
    requests = [s for s in spans if s.name == "batchserve.request"]
    passes = [s for s in spans if s.name == "batchserve.pass"]
    assert len(requests) == 5
    by_id = {s.context.span_id: s for s in requests}
    linked: dict[int, list[int]] = {}
    for p in passes:
        a = attrs(p)
        assert a["batchserve.model"] == "emb"
        assert a["batchserve.batch_size"] >= 1
        assert p.end_time - p.start_time == pytest.approx(a["batchserve.forward_s"] * 1e9, abs=1e3)
        for link in p.links:
            linked.setdefault(link.context.span_id, []).append(a["batchserve.batch_id"])
    ok = [s for s in requests if attrs(s)["batchserve.reason"] == "ok"]
    assert len(ok) == 4

    # Each successful request's span says what its headers said, and is linked from the
    # passes of exactly its batch ids.
    def values(span: Any, key: str) -> list[Any]:
        got = attrs(span)[key]
        return list(got) if attrs(span)["batchserve.inputs"] > 1 else [got]

    for r in responses[:4]:
        ids = [int(v) for v in r.headers["x-batch-id"].split(",")]
        waits = [float(v) for v in r.headers["x-queue-wait-s"].split(",")]
        forwards = [float(v) for v in r.headers["x-forward-s"].split(",")]
        sizes = [int(v) for v in r.headers["x-batch-size"].split(",")]
        matching = [
            s
            for s in ok
            if attrs(s)["batchserve.inputs"] == len(ids)
            and values(s, "batchserve.batch_id") == ids
            and values(s, "batchserve.queue_wait_s") == pytest.approx(waits, abs=1e-6)
        ]
        assert len(matching) == 1, (ids, waits, [attrs(s) for s in ok])
        span = matching[0]
        assert values(span, "batchserve.forward_s") == pytest.approx(forwards, abs=1e-6)
        assert values(span, "batchserve.batch_size") == sizes
        assert sorted(linked[span.context.span_id]) == sorted(set(ids))
        assert attrs(span)["http.response.status_code"] == 200
        assert span.end_time > span.start_time
    poison = [s for s in requests if attrs(s)["batchserve.reason"] != "ok"]
    assert len(poison) == 1
    assert attrs(poison[0])["batchserve.reason"] == "model_error"
    assert attrs(poison[0])["http.response.status_code"] == 422
    assert poison[0].status.status_code.name == "ERROR"
    assert set(linked) <= set(by_id)
    assert app.tracing is not None
    assert app.tracing.pending == {}  # every pass took its requests


def test_off_by_default_and_nothing_of_opentelemetry_is_imported() -> None:
    code = """
import asyncio, sys, httpx
from batchserve.server import App, ModelSettings, ServerSettings
from batchserve.server.exchange import Exchange
from batchserve.engines.loader import load_model

async def main():
    model = ModelSettings(name="m", spec="synthetic:fixed=0ms,per_item=0ms")
    async with App(ServerSettings(models=(model,)), loader=load_model) as app:
        await app.wait_ready()
        assert app.tracing is None
        assert app._open_exchange.func is Exchange
        t = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=t, base_url="http://x") as c:
            assert (await c.post("/v1/embeddings", json={"input": "x"})).status_code == 200
asyncio.run(main())
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
print("clean")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clean"


def test_serve_otel_flag_and_config_key(tmp_path: Any) -> None:
    from batchserve.cli import build_parser
    from batchserve.cli.serve import build_settings

    def settings(*argv: str) -> ServerSettings:
        return build_settings(build_parser().parse_args(["serve", *argv]), environ={})

    assert settings().otel is False
    assert settings("--otel").otel is True
    config = tmp_path / "serve.toml"
    config.write_text("otel = true\n")
    assert settings("--config", str(config)).otel is True
    config.write_text('otel = "maybe"\n')
    with pytest.raises(ConfigError, match="otel must be on or off, got 'maybe'"):
        settings("--config", str(config))


@pytest.mark.slow
def test_serve_otel_exports_spans() -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with server_process(["--model", "synthetic:fixed=1ms,per_item=0ms", "--otel"], env) as s:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": ["one", "two"]}, timeout=10)
        assert r.status_code == 200
        s.proc.terminate()
        out, err = s.proc.communicate(timeout=30)
    assert s.proc.returncode == 0, err
    assert '"name": "batchserve.request"' in out
    assert '"name": "batchserve.pass"' in out
    assert f'"batchserve.batch_id": {r.headers["x-batch-id"].split(",")[0]}' in out
