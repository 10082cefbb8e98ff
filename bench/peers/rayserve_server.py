"""Ray Serve serving the benchmark's model with ``@serve.batch``.

One replica; ``@serve.batch(max_batch_size=..., batch_wait_timeout_s=...)`` collects the
calls that reach it. The replica takes at most ``max_ongoing_requests`` at once (set to twice
the max batch, so that the next batch can fill while one runs: Ray's default of 5 would cap
every batch at 5), and the proxy queues at most ``--queue-size`` more (Ray's
``max_queued_requests``, refused with 503 beyond it). The forward pass runs in a thread
(``asyncio.to_thread``), so the replica's event loop keeps collecting meanwhile. Ray has no
per-request deadline.

Ray is started small for a 2-core machine, on loopback only: ``num_cpus=2``, no dashboard,
no usage stats, workers at normal priority (Ray's default niceness is 15),
a 128 MB object store, warnings only, no access log.

Run: ``bench/.venvs/rayserve/bin/python bench/peers/rayserve_server.py --port 8000``
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

# Set before Ray starts so that every Ray process inherits them: the replica imports
# ``_common`` from this folder, and nothing phones home.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])
)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Ray starts its workers (the proxy and the replica among them) at niceness 15 by default; on
# a machine shared with the load generator that starves the server under test.
os.environ.setdefault("RAY_worker_niceness", "0")
# A single-node Ray on loopback only (as Ray runs on macOS): without it, Ray advertises and
# talks to the machine's network address even when told 127.0.0.1.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray
from _common import build_model, embedding_reply, peer_args, text_of
from ray import serve
from ray.serve.schema import LoggingConfig
from starlette.requests import Request
from starlette.responses import JSONResponse


def make_app(args: Any) -> Any:
    """The Serve application for ``args`` (the batching knobs are fixed at definition)."""

    @serve.deployment(
        num_replicas=1,
        max_ongoing_requests=2 * args.max_batch,
        max_queued_requests=args.queue_size,
        ray_actor_options={"num_cpus": 0},
        logging_config=LoggingConfig(enable_access_log=False, log_level="WARNING"),
    )
    class Embeddings:
        def __init__(self) -> None:
            self.model = build_model(args)

        @serve.batch(max_batch_size=args.max_batch, batch_wait_timeout_s=args.max_wait_ms / 1e3)
        async def embed(self, texts: list[str]) -> list[list[float]]:
            import asyncio

            return await asyncio.to_thread(self.model, texts)

        async def __call__(self, request: Request) -> JSONResponse:
            try:
                body = await request.json()
                text = text_of(body)
            except ValueError as exc:
                return JSONResponse({"detail": str(exc)}, status_code=400)
            vector = await self.embed(text)
            return JSONResponse(embedding_reply(str(body.get("model", "")), vector, text))

    return Embeddings.bind()


def main() -> None:
    args = peer_args(__doc__.splitlines()[0])
    ray.init(
        _node_ip_address="127.0.0.1",  # every Ray process on loopback only
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=128 * 1024 * 1024,
        logging_level="warning",
        log_to_driver=False,
        configure_logging=True,
    )
    # No access log and warnings only: Ray Serve's performance advice for high request rates.
    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    serve.start(http_options={"host": args.host, "port": args.port}, logging_config=quiet)
    serve.run(make_app(args), name="embeddings", route_prefix="/v1/embeddings")
    print(f"ready on http://{args.host}:{args.port}", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
