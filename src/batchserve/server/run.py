"""Running the server: uvicorn, the ready line, SIGTERM draining, the exit status.

Theory of operation: :func:`serve` binds the listening socket itself (so port 0 gives a port
known before anything else happens), starts uvicorn on it (httptools and uvloop when
installed, access log off; inference requests carried by
:mod:`batchserve.server.transport.httptools`) and the app's lifespan starts loading the models.
Meanwhile
inference answers 503 ``not_ready``. When every model is loaded and warm, ONE line goes to
stdout, the ready line::

    batchserve ready on http://127.0.0.1:8000 models=all-MiniLM-L6-v2

(other messages go to stderr). With ``grpc_port`` the same app's models are served over gRPC
too (:mod:`batchserve.server.transport.grpc`, on the same event loop), and the ready line ends
with ``grpc=HOST:PORT``. With ``ssl_certfile`` and ``ssl_keyfile`` both transports serve TLS
with that certificate (the ready line's URL is then ``https://``), and with ``ssl_ca_certs`` both
require a client certificate signed by one of its authorities. A model that fails to load
stops the server; its error is raised to the caller (the CLI prints it and exits 1).

The first SIGTERM (or SIGINT) stops admitting (new inference requests: 503 ``draining`` with
Retry-After, gRPC calls ``UNAVAILABLE``; ``/v2/health/ready``: 503), finishes every accepted
request and sends its response, bounded by ``drain_timeout_s``, then closes the listeners and
returns 0. A second signal exits at once with status 1 and says so on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Generator
from typing import Any, Protocol, TextIO

import uvicorn

from batchserve.engines.loader import load_model
from batchserve.errors import ConfigError
from batchserve.models.loader import LoadedModel
from batchserve.server.app import App
from batchserve.server.settings import ServerSettings
from batchserve.server.transport.httptools import connection_protocol

__all__ = ["SWITCH_INTERVAL_S", "bind", "serve", "serve_async"]

#: The interpreter's thread switch interval while :func:`serve` runs (Python's default: 5 ms).
#: The event loop holds the GIL while it has work; a model thread handed a pass, or back from
#: a sleep or a native call, waits up to this long for the GIL before it runs Python again.
#: Under load the loop always has work: with the seed's model at 3x overload (6,000
#: requests/s), a pass began 2.2-2.6 ms after the loop handed it over at 5 ms, 1.4 ms at 1 ms
#: and 0.6 ms at 0.2 ms (timestamps taken by hand around ``Batcher._start`` and the worker's
#: ``_run_in_thread``, one run each; not a bench script). Shorter costs switches where the
#: model thread is always busy: on the null model, closed loop, 0.2 ms gave 0.76-0.79x the
#: yardstick's requests/s where 5 ms gave 0.90x and 1 ms 0.87x (``bench/server/request_path.py``,
#: one run each).
SWITCH_INTERVAL_S = 0.001

#: Once drained, how long gRPC calls still being written may take before the listener closes.
_GRPC_GRACE_S = 5.0


def _client_certs(ca_certs: str | None) -> dict[str, Any]:
    """Uvicorn's settings that require a client certificate signed by ``ca_certs``."""
    if ca_certs is None:
        return {}
    return {"ssl_ca_certs": ca_certs, "ssl_cert_reqs": ssl.CERT_REQUIRED}


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, with signals left to :class:`_Lifecycle`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class _Stoppable(Protocol):
    async def stop(self, grace_s: float | None) -> None: ...


class _Lifecycle:
    """Signals -> drain -> exit."""

    def __init__(self, app: App, server: _Server, drain_timeout_s: float, err: TextIO) -> None:
        self.app = app
        self.server = server
        #: The gRPC transport, when served: stopped once the app has drained.
        self.grpc: _Stoppable | None = None
        self.drain_timeout_s = drain_timeout_s
        self.err = err
        self.signalled = False
        self._task: asyncio.Task[None] | None = None

    def on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self.signalled:
            print(
                f"batchserve: second {name}: exiting now, without draining; "
                f"{self.app.inflight} accepted requests get no answer",
                file=self.err,
            )
            self.err.flush()
            sys.stdout.flush()
            os._exit(1)
        self.signalled = True
        print(
            f"batchserve: {name}: draining: admitting nothing new, finishing "
            f"{self.app.inflight} accepted requests (at most {self.drain_timeout_s:g}s)",
            file=self.err,
            flush=True,
        )
        self.app.begin_drain()
        self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self.app.drain(self.drain_timeout_s)
            if self.grpc is not None:
                # Every accepted call is answered: what is left is writing the last replies.
                await self.grpc.stop(_GRPC_GRACE_S)
        finally:
            self.server.should_exit = True


async def serve_async(
    settings: ServerSettings,
    *,
    loader: Callable[[str], LoadedModel] = load_model,
    log_level: str = "warning",
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status (0 after a clean drain).

    Raises:
        OSError: the address cannot be bound.
        Exception: whatever a model raised while loading (after the server stopped).
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    app = App(settings, loader=loader)
    sock = bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host
    scheme = "http" if settings.ssl_certfile is None else "https"
    url = f"{scheme}://{url_host}:{port}"
    config = uvicorn.Config(
        app,
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=5,
        http=connection_protocol(app, read_timeout_s=settings.limits.read_timeout_s),
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        **_client_certs(settings.ssl_ca_certs),
    )
    server = _Server(config)
    life = _Lifecycle(app, server, settings.drain_timeout_s, err)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, life.on_signal, sig)
    names = ",".join(m.name for m in settings.models)
    grpc_line = ""
    if settings.grpc_port is not None:
        try:
            from batchserve.server.transport.grpc import GrpcTransport, tls_credentials
        except ImportError as exc:
            sock.close()
            raise ConfigError(
                f"--grpc-port needs grpcio: pip install 'batchserve[grpc]' ({exc})"
            ) from None
        transport = life.grpc = GrpcTransport(app, max_concurrent_calls=settings.grpc_max_calls)
        credentials = None
        if settings.ssl_certfile is not None and settings.ssl_keyfile is not None:
            credentials = tls_credentials(
                settings.ssl_certfile, settings.ssl_keyfile, ca_certs=settings.ssl_ca_certs
            )
        try:
            grpc_port = await transport.start(
                settings.host, settings.grpc_port, credentials=credentials
            )
        except RuntimeError:
            sock.close()
            raise OSError(f"gRPC could not bind {settings.host}:{settings.grpc_port}") from None
        grpc_line = f" grpc={url_host}:{grpc_port}"
    print(
        f"batchserve: listening on {url}{grpc_line}, loading models={names}", file=err, flush=True
    )
    serving = loop.create_task(server.serve(sockets=[sock]))
    load_error: BaseException | None = None
    try:
        while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.01)
        # A signal may stop the server while the models still load: wait for either.
        ready = loop.create_task(app.wait_ready())
        await asyncio.wait({ready, serving}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done() and not ready.cancelled():
            load_error = ready.exception()
            if load_error is not None:
                server.should_exit = True
            else:
                # The models and everything loaded with them live as long as the process:
                # keep them out of the cyclic collector's full passes (shorter GC pauses).
                gc.collect()
                gc.freeze()
                if not life.signalled:
                    print(
                        f"batchserve ready on {url} models={names}{grpc_line}", file=out, flush=True
                    )
        await serving
        if not ready.done() or ready.cancelled():
            ready.cancel()
            print("batchserve: stopped before the models finished loading", file=err, flush=True)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        sock.close()
        if life.grpc is not None:
            await life.grpc.stop(0)
    if load_error is not None:
        raise load_error
    return 0


def serve(settings: ServerSettings, **kwargs: Any) -> int:
    """Run :func:`serve_async` on a fresh event loop (uvloop when installed).

    Keyword arguments go to :func:`serve_async`.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(serve_async(settings, **kwargs))
    finally:
        sys.setswitchinterval(interval)
