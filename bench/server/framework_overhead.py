"""Per-request overhead of the HTTP stack, trivial endpoint, measured side by side.

Each contender serves ``POST /echo`` (read a small JSON body, answer a small JSON body) and
``GET /ping`` on uvicorn (httptools + uvloop, access log off) in its own process on a free
port of 127.0.0.1:

* ``raw``: a bare ASGI callable (what batchserve's server is built on);
* ``batchserve``: batchserve's own app, ``GET /v2/health/live`` and a synthetic zero-cost
  model on ``POST /v1/embeddings`` (all of its routing, validation and headers included);
* ``starlette`` and ``fastapi`` (pydantic model for the body), when installed.

A raw-socket HTTP/1.1 client on one keep-alive connection sends requests one after another
and times each round trip; the median minus the raw ASGI app's median is the framework's own
overhead per request. The client is the same for every contender, so its cost cancels out.
This is a closed-loop micro-benchmark of overhead, not a load test. On a shared 2-core
machine the figures are noisy: compare within one run.

Run: ``python bench/server/framework_overhead.py [--requests 3000]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import sys
import time
from typing import Any

from batchserve_testing.bench import free_port, serving

BODY = json.dumps({"input": "hello world", "model": "m"}).encode()


def raw_app() -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        out = json.dumps({"ok": True, "n": len(json.loads(body)) if body else 0}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(out)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": out})

    return app


def starlette_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def echo(request: Request) -> JSONResponse:
        data = await request.json()
        return JSONResponse({"ok": True, "n": len(data)})

    async def ping(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "n": 0})

    return Starlette(
        routes=[Route("/echo", echo, methods=["POST"]), Route("/ping", ping, methods=["GET"])]
    )


def fastapi_app() -> Any:
    from fastapi import FastAPI
    from pydantic import BaseModel

    class Body(BaseModel):
        input: str
        model: str

    app = FastAPI()

    async def echo(body: Any) -> dict[str, Any]:
        return {"ok": True, "n": 2}

    # Annotations are strings here (postponed); FastAPI needs the class itself.
    echo.__annotations__ = {"body": Body, "return": dict}
    app.post("/echo")(echo)

    @app.get("/ping")
    async def ping() -> dict[str, Any]:
        return {"ok": True, "n": 0}

    return app


def batchserve_app() -> Any:
    from batchserve.config import BatchConfig
    from batchserve.server import ModelSettings, ServerSettings, create_app

    # max_wait 0: a lone request is dispatched at once, so only the server's own work counts.
    model = ModelSettings(
        name="m",
        spec="synthetic:fixed=0ms,per_item=0ms,dim=8",
        batch=BatchConfig(max_wait_s=0.0),
    )
    settings = ServerSettings(models=(model,))
    return create_app(settings)


FACTORIES = {
    "raw": raw_app,
    "batchserve": batchserve_app,
    "starlette": starlette_app,
    "fastapi": fastapi_app,
}
PATHS = {
    "raw": ("/ping", "/echo"),
    "starlette": ("/ping", "/echo"),
    "fastapi": ("/ping", "/echo"),
    "batchserve": ("/v2/health/live", "/v1/embeddings"),
}


def serve(name: str, port: int) -> None:
    import uvicorn

    app = FACTORIES[name]()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        backlog=1024,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run()


def _open(port: int) -> bool:
    return True  # the port accepts connections: the app has no model to load


def _read_response(sock: socket.socket, buf: bytearray) -> int:
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = bytes(buf[:end]).decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            total = end + 4 + length
            while len(buf) < total:
                buf += sock.recv(65536)
            status = int(head.split(" ", 2)[1])
            del buf[:total]
            return status
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk


def measure(port: int, path: str, post: bool, n: int) -> list[float]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if post:
        req = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY
    else:
        req = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    buf = bytearray()
    times = []
    for i in range(n + 200):
        t0 = time.perf_counter()
        sock.sendall(req)
        status = _read_response(sock, buf)
        if status != 200:
            raise RuntimeError(f"{path} answered {status}")
        if i >= 200:  # warm-up excluded
            times.append(time.perf_counter() - t0)
    sock.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per round and stack")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return 0
    names = ["raw", "batchserve"]
    for extra in ("starlette", "fastapi"):
        try:
            __import__(extra)
            names.append(extra)
        except ImportError:
            print(f"({extra} not installed: pip install {extra} to compare it)")
    rows: dict[str, tuple[float, float]] = {}
    ports = {name: free_port() for name in names}
    with contextlib.ExitStack() as servers:
        for name in names:
            argv = [sys.executable, __file__, "--serve", name, "--port", str(ports[name])]
            ready = None if name == "batchserve" else _open  # batchserve: its model answers
            servers.enter_context(serving(argv, ports[name], ready=ready))
        # Rounds in turn, best median of each: the machine's noise hits every stack alike.
        for _ in range(args.rounds):
            for name in names:
                get_path, post_path = PATHS[name]
                g = statistics.median(measure(ports[name], get_path, False, args.requests))
                p = statistics.median(measure(ports[name], post_path, True, args.requests))
                old = rows.get(name, (g, p))
                rows[name] = (min(old[0], g), min(old[1], p))
    base_get, base_post = rows["raw"]
    print(f"{'stack':<12} {'GET us':>8} {'POST us':>8} {'GET +us':>8} {'POST +us':>8}")
    for name, (g, p) in rows.items():
        print(
            f"{name:<12} {g * 1e6:8.1f} {p * 1e6:8.1f} "
            f"{(g - base_get) * 1e6:8.1f} {(p - base_post) * 1e6:8.1f}"
        )
    print(
        "(best of the rounds' median round trips on one keep-alive connection; +us is over "
        "the raw ASGI app; batchserve's POST includes batching a zero-cost model)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
