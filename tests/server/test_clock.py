"""The server on one injected clock: a request's times are read from it, and only from it."""

from __future__ import annotations

import asyncio
from typing import Any

from server_helpers import build_app, client_for, embedding_model

from batchserve.clock import ManualClock
from batchserve.config import BatchConfig
from support import wait_for


def _embed(texts: list[str]) -> list[list[float]]:
    return [[1.0, 0.0, 0.0, 0.0] for _ in texts]


async def test_an_answer_s_times_are_the_clock_s() -> None:
    clock = ManualClock(start=100.0)
    app = build_app(
        {"m": embedding_model(_embed)},
        batch={"m": BatchConfig(max_batch_size=8, max_wait_s=0.25)},
        clock=clock,
    )
    async with client_for(app) as client:
        model = app.registry.require("m")
        assert model.require_batcher().clock is clock
        posted: asyncio.Task[Any] = asyncio.ensure_future(
            client.post("/v1/embeddings", json={"model": "m", "input": "a"})
        )
        assert await wait_for(lambda: model.require_batcher().statistics().queue_depth == 1)
        clock.advance(0.25)  # the batch closes at its max wait, on this clock alone
        response = await posted
    assert response.status_code == 200
    assert response.headers["x-queue-wait-s"] == "0.250000"
    assert response.headers["server-timing"] == "total;dur=250.000"
