"""Helpers for the server tests: in-process apps over httpx, and real servers on port 0."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from batchserve.clock import Clock
from batchserve.config import BatchConfig, CostEstimate
from batchserve.engines.loader import load_model
from batchserve.models.kinds import EMBEDDING
from batchserve.models.loader import LoadedModel
from batchserve.server import App, ModelSettings, RequestLimits, ServerSettings

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def embedding_model(fn: Any, dim: int = 4, **kw: Any) -> LoadedModel:
    """An embedding model for tests; its stated zero cost skips the warm-up passes."""
    kw.setdefault("initial_cost", CostEstimate(fixed_s=0.0, per_item_s=0.0))
    return LoadedModel(spec="test", fn=fn, kind=EMBEDDING, dimension=dim, **kw)


def build_app(
    models: dict[str, LoadedModel | str],
    *,
    batch: dict[str, BatchConfig] | None = None,
    timeout_s: float = 30.0,
    limits: RequestLimits | None = None,
    api_key: str | None = None,
    clock: Clock | None = None,
) -> App:
    """An app serving ``models`` (name -> LoadedModel, or a SPEC string to load for real)."""
    batch = batch or {}

    def loader(spec: str) -> LoadedModel:
        value = models[spec]
        return load_model(value) if isinstance(value, str) else value

    settings = ServerSettings(
        models=tuple(
            ModelSettings(
                name=name, spec=name, batch=batch.get(name, BatchConfig()), timeout_s=timeout_s
            )
            for name in models
        ),
        limits=limits or RequestLimits(),
        api_key=api_key,
    )
    return App(settings, loader=loader, clock=clock)


@contextlib.asynccontextmanager
async def client_for(app: App, *, wait: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """Start ``app`` (and wait for its models unless ``wait`` is False) and an httpx client."""
    await app.start()
    if wait:
        await app.wait_ready()
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://batchserve") as c:
            yield c
    finally:
        await app.stop()


class ServerProcess:
    """A real ``batchserve serve`` in a subprocess; ``url`` once its ready line is read."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        full_env = dict(os.environ)
        full_env.update(
            HF_HUB_OFFLINE="1",
            PYTHONPATH=os.pathsep.join([str(HERE), full_env.get("PYTHONPATH", "")]),
        )
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "batchserve", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.match(r"batchserve ready on (https?://\S+) models=", line)
        if match is None:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise RuntimeError(f"server did not start: {line!r} {err}")
        self.url = match.group(1)
        self.port = int(self.url.rsplit(":", 1)[1])
        found = re.search(r" grpc=(\S+)", line)
        #: ``host:port`` of the gRPC service (``--grpc-port``), else None.
        self.grpc = found.group(1) if found else None

    def stop(self, timeout_s: float = 30) -> tuple[int, str]:
        """SIGTERM, then the exit status and stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.wait(timeout_s)

    def wait(self, timeout_s: float = 30) -> tuple[int, str]:
        """Wait for the exit (killing it after ``timeout_s``); the exit status and stderr."""
        try:
            _, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
        return self.proc.returncode, err


@contextlib.contextmanager
def server_process(args: list[str], env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    server = ServerProcess(args, env)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        with contextlib.suppress(ValueError, subprocess.TimeoutExpired):
            server.proc.communicate(timeout=10)  # closes the pipes
