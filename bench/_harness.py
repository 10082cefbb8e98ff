"""What the bench scripts share: a free port, the null model's probe, a process's CPU.

Scripts import it as a sibling (``from _harness import ...``): they run by path from the
repository root (``python bench/<script>.py``), where their own directory is on the path.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import NamedTuple

__all__ = [
    "BENCH",
    "ROOT",
    "Served",
    "answers",
    "batchserve",
    "children",
    "cpu_s",
    "free_port",
    "process_cpu_s",
]

#: This directory, and the repository's root.
BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent


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
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
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
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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


def cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its children that were waited for (a server's workers)."""
    return sum(process_cpu_s(p) for p in [pid, *children(pid)])


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) of one live process so far; 0 if it is gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a server's workers)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]
    return []
