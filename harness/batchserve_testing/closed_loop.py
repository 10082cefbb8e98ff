"""A closed loop of embedding requests: kept-alive connections, each waiting for its answer.

:func:`embeddings` opens ``connections`` HTTP/1.1 connections, one thread each
(:mod:`http.client`); each sends ``POST /v1/embeddings`` with the next request of a
sequence (shared by all, taken round and round) as soon as its last one is answered, until
``seconds`` passed; the requests in flight then finish. A request of one text sends it as a
string, as a query does (the project's generator does the same); of several, as a list.

The client is kept light, since on a small machine its CPU is taken from the server: the
bodies are encoded once before the clock starts, and an answer is checked by its status and
its count of ``"index"`` keys (one a vector) rather than parsed. Its CPU is read from
``/proc`` (this process, every thread) and returned beside the figures, so a script can say
what share of the machine the client took.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from batchserve_testing.process import process_cpu_s

__all__ = ["Loop", "embeddings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Loop:
    """What one closed loop measured.

    Attributes:
        texts: texts in the answered requests.
        requests: answered requests.
        wall_s: from the first send to the last answer.
        latencies_s: each answered request's, sorted.
        client_cpu_s: CPU seconds this process spent meanwhile (all its threads).
    """

    texts: int
    requests: int
    wall_s: float
    latencies_s: tuple[float, ...]
    client_cpu_s: float

    @property
    def texts_per_s(self) -> float:
        """Texts answered over the wall time."""
        return self.texts / self.wall_s if self.wall_s else 0.0

    def quantile_s(self, q: float) -> float:
        """A request's latency at quantile ``q`` (0.5: the median); NaN if none answered."""
        lat = self.latencies_s
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")

    @property
    def client_cores(self) -> float:
        """The client's CPU as cores busy on average (CPU seconds over wall seconds)."""
        return self.client_cpu_s / self.wall_s if self.wall_s else 0.0


def embeddings(
    url: str,
    model: str,
    requests: Sequence[Sequence[str]],
    *,
    connections: int,
    seconds: float,
    timeout_s: float = 300.0,
) -> Loop:
    """Run the closed loop (see the module docstring) against ``url`` (``http://host:port``).

    Blocks for ``seconds`` and until the requests in flight are answered.

    Raises:
        RuntimeError: an answer was not 200, or had not one vector per text (the first
            failure stops every connection).
    """
    bodies = [
        (
            json.dumps({"model": model, "input": r[0] if len(r) == 1 else list(r)}).encode(),
            len(r),
        )
        for r in requests
    ]
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    order = itertools.count()
    latencies: list[float] = []
    texts = [0]
    failures: list[str] = []
    lock = threading.Lock()
    headers = {"Content-Type": "application/json"}

    def connection() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        try:
            while time.perf_counter() < stop_at and not failures:
                body, n = bodies[next(order) % len(bodies)]
                sent = time.perf_counter()
                conn.request("POST", "/v1/embeddings", body, headers)
                resp = conn.getresponse()
                raw = resp.read()
                took = time.perf_counter() - sent
                if resp.status != 200:
                    failures.append(f"HTTP {resp.status}: {raw[:200]!r}")
                    return
                vectors = raw.count(b'"index"')
                if vectors != n:
                    failures.append(f"{vectors} vectors for {n} texts")
                    return
                with lock:
                    latencies.append(took)
                    texts[0] += n
        except (OSError, http.client.HTTPException) as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    threads = [threading.Thread(target=connection) for _ in range(connections)]
    cpu0 = process_cpu_s(os.getpid())
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = process_cpu_s(os.getpid()) - cpu0
    if failures:
        raise RuntimeError(failures[0])
    return Loop(
        texts=texts[0],
        requests=len(latencies),
        wall_s=wall,
        latencies_s=tuple(sorted(latencies)),
        client_cpu_s=cpu,
    )
