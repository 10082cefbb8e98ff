"""The yardstick: the simplest dynamic batcher on batchserve's HTTP stack, for ratios.

An ASGI app on uvicorn + httptools + uvloop that answers OpenAI ``POST /v1/embeddings``
(``{"input": "text"}``) through a bounded queue (429 when full), batches of at most 64
closed when full or 2 ms after the oldest arrival, one thread hop per batch, and
standard-library JSON: the same request and answer (8 floats) as batchserve's null model.
No deadlines, metrics, validation or disconnect handling: what batchserve does per request
beyond this is its overhead. Run it: ``python bench/apps/yardstick.py --port 8001``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import uvicorn

MAX_BATCH, MAX_WAIT_S, QUEUE = 64, 0.002, 1024
VECTOR = [0.0] * 8


class Yardstick:
    def __init__(self) -> None:
        self.queue: list[tuple[str, asyncio.Future[list[float]]]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.busy = False

    def submit(self, text: str) -> asyncio.Future[list[float]] | None:
        if len(self.queue) >= QUEUE:
            return None
        fut = asyncio.get_running_loop().create_future()
        self.queue.append((text, fut))
        self.kick()
        return fut

    def kick(self) -> None:
        if self.busy or not self.queue:
            return
        loop = asyncio.get_running_loop()
        if len(self.queue) < MAX_BATCH and self.timer is None:
            self.timer = loop.call_later(MAX_WAIT_S, self.flush)
        elif len(self.queue) >= MAX_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.busy or not self.queue:
            return
        batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
        self.busy = True
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, lambda b: [VECTOR] * len(b), batch).add_done_callback(
            lambda f: self.done(batch, f.result())
        )

    def done(self, batch: list[Any], outputs: list[list[float]]) -> None:
        self.busy = False
        for (_, fut), out in zip(batch, outputs, strict=True):
            if not fut.done():
                fut.set_result(out)
        self.kick()


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    text = json.loads(body)["input"]
    fut = YARDSTICK.submit(text)
    out: dict[str, Any]
    if fut is None:
        status, out = 429, {"error": "queue full"}
    else:
        vector = await fut
        status, out = 200, {"object": "list", "data": [{"embedding": vector, "index": 0}]}
    payload = json.dumps(out).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


YARDSTICK = Yardstick()

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        lifespan="off",
    )
