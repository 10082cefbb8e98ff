"""The connection protocol driven in-process: fake transports fed raw HTTP, a real app.

What a socket test cannot pin down cheaply: the keep-alive timer kept across requests
(armed once, not per request), and requests that go to the ASGI app on a connection whose
inference requests bypass it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from server_helpers import build_app
from uvicorn.server import ServerState

from batchserve.server import App
from batchserve.server.transport.httptools import connection_protocol
from support import wait_for

BODY = b'{"input": "hello world"}'
EMBED = b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
EMBED += b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name in ("sockname", "peername") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.fixture
async def app() -> AsyncIterator[App]:
    a = build_app({"m": "synthetic:fixed=0ms,per_item=0ms,dim=4"})
    await a.start()
    await a.wait_ready()
    yield a
    await a.stop()


def connect(app: App, keep_alive_s: float) -> tuple[Any, Transport]:
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type]
        http=connection_protocol(app, read_timeout_s=30),
    )
    config.load()
    loop = asyncio.get_running_loop()
    protocol_class: Any = config.http_protocol_class
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


async def answers(transport: Transport, n: int) -> None:
    for _ in range(500):
        if transport.written.count(b"HTTP/1.1 ") >= n:
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"{n} answers expected, got {transport.written!r}")


@pytest.mark.slow
async def test_an_idle_connection_is_closed_after_keep_alive_and_a_busy_one_is_not(
    app: App,
) -> None:
    # Real time (uvicorn's keep-alive timer is the event loop's), so not in the fast tier.
    # Keep-alive 0.3 s, a request every 0.08 s: 0.2 s of margin for a busy machine's stalls.
    busy, busy_t = connect(app, 0.3)
    idle, idle_t = connect(app, 0.3)
    idle.data_received(EMBED)
    await answers(idle_t, 1)
    # The busy connection sends a request every 0.08 s, across two keep-alive periods:
    # its one timer, armed after its first answer, is armed again, never closes it.
    for n in range(1, 9):
        busy.data_received(EMBED)
        await answers(busy_t, n)
        await asyncio.sleep(0.08)
    assert idle_t.closed, "idle since its one answer, over 0.6 s ago"
    assert not busy_t.closed
    assert busy.timeout_keep_alive_task is not None  # one timer, kept
    # A request under way when the timer comes due is not cut off; its answer re-arms.
    await asyncio.sleep(0.45)
    assert busy_t.closed
    again, again_t = connect(app, 0.1)
    again.data_received(EMBED)
    await answers(again_t, 1)
    again.data_received(EMBED[:30])  # a head that has begun...
    await asyncio.sleep(0.15)
    assert not again_t.closed, "a request has begun since the last answer"
    again.data_received(EMBED[30:])
    await answers(again_t, 2)
    await asyncio.sleep(0.2)
    assert again_t.closed


async def test_other_requests_go_to_the_asgi_app_on_the_same_connection(app: App) -> None:
    protocol, transport = connect(app, 5.0)
    protocol.data_received(LIVE)
    await answers(transport, 1)
    protocol.data_received(EMBED)
    await answers(transport, 2)
    protocol.data_received(LIVE)
    await answers(transport, 3)
    first, second, third = transport.written.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200")
    assert third.startswith(b"200")
    assert second.startswith(b"200")
    assert b'"embedding"' in second
    assert not transport.closed
    protocol.connection_lost(None)
    assert protocol.timeout_keep_alive_task is None


async def test_refusals_from_the_head_repeat_the_same_answer_each_with_its_own_timing() -> None:
    from batchserve.config import BatchConfig, CostEstimate

    cost = CostEstimate(fixed_s=0.0, per_item_s=0.0)
    # Prefetch off: the one queue slot is taken by the request behind the stuck pass.
    batch = BatchConfig(
        max_batch_size=1, max_wait_s=0.0, queue_size=1, initial_cost=cost, prefetch=False
    )
    stuck = build_app(
        {"m": "synthetic:fixed=1000s,per_item=0ms,dim=4"}, batch={"m": batch}, timeout_s=1e6
    )
    await stuck.start()
    await stuck.wait_ready()
    running, _ = connect(stuck, 5.0)
    queued, _ = connect(stuck, 5.0)
    running.data_received(EMBED)
    batcher = stuck.registry.require("m").require_batcher()
    assert await wait_for(lambda: batcher.statistics().running_items == 1)
    queued.data_received(EMBED)
    refused = []
    for _ in range(3):
        protocol, transport = connect(stuck, 5.0)
        protocol.data_received(EMBED)
        await answers(transport, 1)
        refused.append(transport.written)
    heads = [r.split(b"\r\n\r\n")[0].split(b"\r\n") for r in refused]
    for head in heads:
        assert head[0] == b"HTTP/1.1 429 Too Many Requests"
        assert sum(line.startswith(b"server-timing:") for line in head) == 1
        assert b"x-reason: queue_full" in head
    # Built once, sent three times: the same body and headers but for the timing.
    assert len({r.split(b"\r\n\r\n")[1] for r in refused}) == 1
    assert (
        len({tuple(h for h in head if not h.startswith(b"server-timing")) for head in heads}) == 1
    )
    counters = stuck.registry.require("m").require_batcher().statistics().counters
    assert counters.rejected["queue_full"] == 3
    stuck.begin_drain()
    running.connection_lost(None)
    queued.connection_lost(None)


def test_serve_runs_with_a_short_switch_interval_and_restores_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from batchserve.server import ModelSettings, ServerSettings
    from batchserve.server import run as run_module

    seen: list[float] = []

    async def fake_serve_async(settings: ServerSettings, **kwargs: Any) -> int:
        seen.append(sys.getswitchinterval())
        return 0

    monkeypatch.setattr(run_module, "serve_async", fake_serve_async)
    before = sys.getswitchinterval()
    settings = ServerSettings(models=(ModelSettings(name="m", spec="synthetic"),))
    assert run_module.serve(settings) == 0
    assert seen == [pytest.approx(run_module.SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == before


def _head_names(raw: bytes) -> list[bytes]:
    head = raw.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]
    names = [line.partition(b":")[0].lower() for line in head]
    return [n for n in names if n not in (b"date", b"server")]  # uvicorn's own, first


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (b"/v1/embeddings", b'{"input": ["a", "b"]}'),
        (b"/v1/embeddings", b'{"input": 3}'),  # a 400, with X-Reason
        (
            b"/v2/models/m/infer",
            b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]}],'
            b' "outputs": [{"name": "embedding", "parameters": {"binary_data": true}}]}',
        ),
    ],
)
async def test_both_drivers_send_the_same_headers_in_the_same_order(
    app: App, path: bytes, body: bytes
) -> None:
    import httpx

    request = b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" % path
    request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    protocol, transport = connect(app, 5.0)
    protocol.data_received(request)
    await answers(transport, 1)
    wire = _head_names(transport.written)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        r = await client.post(
            path.decode(), content=body, headers={"content-type": "application/json"}
        )
    asgi = [name.lower().encode() for name in r.headers]
    assert wire == asgi
    assert wire[:2] == [b"content-type", b"content-length"]
    assert wire[-1] == b"server-timing"
    if r.status_code == 200:
        assert b"x-batch-size" in wire
    if b"infer" in path:  # binary output: the JSON header's length, among the timing lines
        assert wire.index(b"inference-header-content-length") > wire.index(b"x-forward-s")
    protocol.connection_lost(None)


def test_a_replys_rendered_head_lines_come_after_its_headers_as_pairs() -> None:
    from batchserve.server.exchange import Reply

    reply = Reply(200, [(b"x-reason", b"r")], b"{}", head=b"x-batch-size: 2\r\nx-a: b, c\r\n")
    assert reply.all_headers() == [(b"x-reason", b"r"), (b"x-batch-size", b"2"), (b"x-a", b"b, c")]
    assert reply.headers == [(b"x-reason", b"r")]  # not changed
