"""What every bench script shares: servers started and stopped, a closed-loop client, CPU.

* :func:`batchserve`: ``batchserve serve --port 0 FLAGS`` until the block ends (its ready
  line says where it listens);
* :func:`serving`: any command that serves HTTP on a given port (the yardstick, the same
  app under other ASGI servers), until the block ends; :func:`running` starts one of the
  request path's contenders (:data:`CONTENDERS`, :data:`OTEL_CONTENDERS`) that way;
* :func:`wrk`: the closed-loop client (Debian's ``wrk``); the project's open-loop load
  generator is :func:`batchserve.loadgen.run_load` in process, or ``batchserve load`` in
  processes of its own: :func:`start_load` starts one, :func:`load_report` reads its JSON;
* :func:`free_port`, :func:`cpu_s`, :func:`process_cpu_s`: from :mod:`batchserve_testing`,
  which the tests use too (nothing here imports from ``tests/``).

Scripts run by path from the repository root (``python bench/<group>/<script>.py``) and
import this module as :mod:`batchserve_testing.bench`, from any folder, with no path edit.
The apps the contenders serve (the yardstick, the RSGI app, the null app) are in
``bench/apps/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from batchserve_testing.process import children, cpu_s, free_port, process_cpu_s

__all__ = [
    "APPS",
    "BENCH",
    "CONTENDERS",
    "NGINX_CONF",
    "OTEL_CONTENDERS",
    "NULL",
    "OUT",
    "ROOT",
    "Served",
    "answers",
    "batchserve",
    "children",
    "contender",
    "cpu_s",
    "load_report",
    "free_port",
    "process_cpu_s",
    "running",
    "serving",
    "start_load",
    "wrk",
]

#: The repository's root, its bench, the bench's apps, and where scripts write raw figures.
ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
APPS = BENCH / "apps"
OUT = BENCH / "out"
#: The nginx configuration the fleet runs behind.
NGINX_CONF = ROOT / "deploy" / "nginx" / "batchserve.conf"
#: The null model: costs nothing, answers 8 floats.
NULL = "m=synthetic:fixed=0ms,per_item=0ms,dim=8"
_BIN = pathlib.Path(sys.executable).parent
_ENV = {"HF_HUB_OFFLINE": "1"}


class Served(NamedTuple):
    """A running ``batchserve serve``: its URL, address and process (and gRPC address)."""

    url: str
    host: str
    port: int
    proc: subprocess.Popen[str]
    #: ``host:port`` of the gRPC service when served (``--grpc-port``), else None.
    grpc: str | None = None


@contextlib.contextmanager
def batchserve(flags: list[str], *, env: dict[str, str] | None = None) -> Iterator[Served]:
    """``batchserve serve --port 0 FLAGS`` from the repository root, until the block ends.

    Yields once the server printed its ready line (every model loaded and warm); stops it
    with SIGTERM (a drain) on the way out, SIGKILL if it is not gone 30 s later. Its log
    goes to this process's stderr.

    Raises:
        RuntimeError: the server exited before it was ready.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "batchserve", "serve", "--port", "0", *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **_ENV, **(env or {})},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"ready on (http://([\d.]+):(\d+))", line)
        if found is None:
            raise RuntimeError(f"the server did not start: {line!r}")
        grpc = re.search(r" grpc=(\S+)", line)
        yield Served(
            found.group(1),
            found.group(2),
            int(found.group(3)),
            proc,
            grpc.group(1) if grpc else None,
        )
    finally:
        _stop(proc, 30)


def start_load(url: str, flags: dict[str, object]) -> subprocess.Popen[str]:
    """``batchserve load URL --FLAG VALUE ... --json --quiet`` with this Python, started.

    ``flags`` maps a flag's name without its dashes (``client_timeout`` for
    ``--client-timeout``) to its value. Read its figures with :func:`load_report`.
    """
    argv = [sys.executable, "-m", "batchserve", "load", url]
    for key, value in flags.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    return subprocess.Popen(
        [*argv, "--json", "--quiet"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **_ENV},
    )


def load_report(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    """The JSON summary a :func:`start_load` run prints, once it ends (``timeout_s`` at most).

    Raises:
        RuntimeError: it printed none (its exit status and the end of its stderr say why).
    """
    out, err = proc.communicate(timeout=timeout_s)
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            report: dict[str, Any] = json.loads(line)
            return report
    raise RuntimeError(f"the load generator exited {proc.returncode}: {err[-2000:]}")


@contextlib.contextmanager
def serving(
    argv: list[str],
    port: int,
    *,
    ready: Callable[[int], bool] | None = None,
    ready_s: float = 60.0,
) -> Iterator[int]:
    """Run ``argv``, a server that listens on ``port``, until the block ends; yields its pid.

    Yields once the port accepts connections and ``ready(port)`` holds (by default
    :func:`answers`: models load after the port opens), or ``ready_s`` passed; stops it
    with SIGTERM, SIGKILL if it is not gone 10 s later. It runs from the repository root;
    its output is discarded.
    """
    ready = answers if ready is None else ready
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **_ENV},
    )
    try:
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.2)
        while time.monotonic() < deadline and not ready(port):
            time.sleep(0.2)
        yield proc.pid
    finally:
        _stop(proc, 10)


def _stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes], wait_s: float) -> None:
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


#: The request path's contenders: each answers ``POST /v1/embeddings`` from the null model,
#: max batch 64, max wait 2 ms (see ``bench/server/request_path.py``).
CONTENDERS = ("yardstick", "batchserve", "batchserve-asgi", "batchserve-granian", "batchserve-rsgi")
#: What ``--otel`` costs: batchserve without it, then with it, its spans made and dropped
#: (``OTEL_TRACES_EXPORTER=none``) and written by the console exporter to /dev/null, which
#: stands in for a collector (what is measured is the spans' making, not a network).
OTEL_CONTENDERS = ("batchserve", "batchserve-otel-dropped", "batchserve-otel-console")
_OTEL_EXPORTER = {"batchserve-otel-dropped": "none", "batchserve-otel-console": "console"}


def contender(name: str, port: int) -> list[str]:
    """The command that serves contender ``name`` on ``port``.

    ``name`` is one of :data:`CONTENDERS` or :data:`OTEL_CONTENDERS`.

    Raises:
        ValueError: an unknown name.
    """
    py = sys.executable
    if name == "yardstick":
        return [py, str(APPS / "yardstick.py"), "--port", str(port)]
    if name in _OTEL_EXPORTER:
        # ``env`` execs the server: the pid it is started with is the server's.
        exporter = f"OTEL_TRACES_EXPORTER={_OTEL_EXPORTER[name]}"
        return ["env", exporter, *contender("batchserve", port), "--otel"]
    if name == "batchserve":
        return [
            *(py, "-m", "batchserve", "serve", "--port", str(port), "--model", NULL),
            *("--max-batch-size", "64", "--max-wait", "2ms", "--queue-size", "1024"),
        ]
    if name == "batchserve-asgi":
        code = (
            "import uvicorn; from batchserve.server.transport.guard import guarded_protocol; "
            f"uvicorn.run('null_app:app', app_dir={str(APPS)!r}, host='127.0.0.1', "
            f"port={port}, loop='uvloop', http=guarded_protocol(read_timeout_s=30), "
            "access_log=False, log_level='warning')"
        )
        return [py, "-c", code]
    if name == "batchserve-granian":
        return [
            *(str(_BIN / "granian"), "--interface", "asgi", "--host", "127.0.0.1"),
            *("--port", str(port), "--loop", "uvloop", "--no-ws", "--working-dir", str(APPS)),
            *("--log-level", "warning", "null_app:app"),
        ]
    if name == "batchserve-rsgi":
        return [py, str(APPS / "rsgi_app.py"), "--port", str(port)]
    known = ", ".join(dict.fromkeys(CONTENDERS + OTEL_CONTENDERS))
    raise ValueError(f"contender must be one of {known}, got {name!r}")


@contextlib.contextmanager
def running(name: str) -> Iterator[tuple[int, int]]:
    """Contender ``name`` on a free port until the block ends; yields its port and pid."""
    port = free_port()
    with serving(contender(name, port), port) as pid:
        yield port, pid


def answers(port: int) -> bool:
    """Whether the server on ``port`` answers an embeddings request for model ``m`` with 200."""
    body = b'{"input": "hello world", "model": "m"}'
    request = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 2) as s:
        s.sendall(request)
        return s.recv(64).startswith(b"HTTP/1.1 200")
    return False


_WRK_SCRIPT = """wrk.method = "POST"
wrk.body = '{"input": "hello world", "model": "m"}'
wrk.headers["Content-Type"] = "application/json"
"""


def wrk(port: int, seconds: float, connections: int = 64) -> tuple[float, int]:
    """Closed loop with ``wrk -t1``: requests/s of 2xx answers and the count of others.

    Every connection resends the null model's embeddings request as soon as it is answered.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(_WRK_SCRIPT)
    try:
        out = subprocess.run(
            [
                *("wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", f.name),
                f"http://127.0.0.1:{port}/v1/embeddings",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    finally:
        os.unlink(f.name)
    rate = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    total = re.search(r"(\d+) requests in", out)
    n_bad = int(bad.group(1)) if bad else 0
    if rate is None or total is None:
        return 0.0, n_bad
    ok_share = 1 - n_bad / max(1, int(total.group(1)))
    return float(rate.group(1)) * ok_share, n_bad
