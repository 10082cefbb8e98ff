"""The request-level counters: every outcome is counted once and they add up.

``received == ok + late + rejected + expired + cancelled + failed + invalid + in flight``, in
process (httpx over ASGI), with one request of each outcome. Real time is used only for the
two deadline outcomes (tolerance: the deadlines are 50 ms against a 300 ms pass).
"""

from __future__ import annotations

import asyncio
import pathlib

import httpx
import pytest

from batchserve.config import BatchConfig
from batchserve.models.faults import FaultyModel
from batchserve.models.kinds import EMBEDDING
from batchserve.models.loader import LoadedModel
from batchserve.server import App, ModelSettings, ServerSettings
from batchserve_testing.harness import OUTCOMES, Scrape
from support import wait_for

pytestmark = pytest.mark.reliability


def faulty_app(env: dict[str, str], batch: BatchConfig | None = None) -> App:
    model = FaultyModel(env)

    def loader(spec: str) -> LoadedModel:
        return LoadedModel(
            spec=spec,
            fn=model,
            kind=EMBEDDING,
            dimension=model.dimension,
            initial_cost=model.initial_cost,
        )

    settings = ServerSettings(
        models=(ModelSettings(name="m", spec="m", batch=batch or BatchConfig(max_wait_s=0.0)),)
    )
    return App(settings, loader=loader)


async def test_one_request_of_each_outcome_and_they_add_up(tmp_path: pathlib.Path) -> None:
    stall = tmp_path / "stall"
    env = {
        "BATCHSERVE_FAULT_COST": "fixed=0ms,per_item=0ms,dim=4",
        "BATCHSERVE_FAULT_POISON": "poison",
        "BATCHSERVE_FAULT_STALL_FILE": str(stall),
    }
    app = faulty_app(env, BatchConfig(max_wait_s=0.0, queue_size=1, admission=False))

    async def main() -> Scrape:
        await app.start()
        await app.wait_ready()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:

            async def embed(text: str, deadline: str = "5s") -> httpx.Response:
                return await c.post(
                    "/v1/embeddings",
                    json={"input": text, "model": "m"},
                    headers={"X-Request-Timeout": deadline},
                )

            assert (await embed("fine")).status_code == 200
            assert (await embed("poison")).status_code == 422
            assert (await c.post("/v1/embeddings", content=b"{")).status_code == 400
            r = await c.post("/v1/embeddings", json={"input": "x", "model": "nope"})
            assert r.status_code == 404
            # A 1 s pass: the first caller's deadline passes during it (late), the second
            # waits in the queue past its deadline (expired), a third finds the queue full
            # (rejected). Each step waits for the batcher to show the one before it.
            batcher = app.registry.models["m"].batcher
            assert batcher is not None
            stall.write_text("1s")
            late = asyncio.ensure_future(embed("slow", "50ms"))
            assert await wait_for(lambda: batcher.statistics().running_items == 1)
            expired = asyncio.ensure_future(embed("queued", "300ms"))
            assert await wait_for(lambda: batcher.statistics().queue_depth == 1)
            assert (await embed("refused")).status_code == 429
            assert (await late).status_code == 504
            assert (await expired).status_code == 504
            stall.unlink()
            scrape = Scrape.parse((await c.get("/metrics")).text)
        await app.stop()
        return scrape

    scrape = await main()
    counts = scrape.requests()
    counts.check()
    assert counts.received == 7
    assert counts.by_outcome == {
        "ok": 1,
        "failed": 1,
        "invalid": 2,
        "late": 1,
        "expired": 1,
        "rejected": 1,
    }
    assert set(counts.by_outcome) <= set(OUTCOMES)
    assert scrape.value("batchserve_bisect_calls_total", model="m") == 0  # a batch of one


async def test_bisection_calls_are_in_the_metrics() -> None:
    env = {"BATCHSERVE_FAULT_COST": "fixed=0ms,per_item=0ms,dim=4", "BATCHSERVE_FAULT_POISON": "p"}
    app = faulty_app(env, BatchConfig(max_batch_size=4, max_wait_s=0.05))

    async def main() -> Scrape:
        await app.start()
        await app.wait_ready()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.post("/v1/embeddings", json={"input": ["a", "b", "p", "d"], "model": "m"})
            assert r.status_code == 422
            scrape = Scrape.parse((await c.get("/metrics")).text)
        await app.stop()
        return scrape

    scrape = await main()
    # [a b p d] raises -> [a b] ok, [p d] raises -> [p] raises, [d] ok: 4 calls after the first.
    assert scrape.value("batchserve_bisect_calls_total", model="m") == 4
    assert scrape.value("batchserve_items_total", model="m", outcome="failed") == 1
    scrape.requests().check()
