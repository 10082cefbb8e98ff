"""The machinery the reliability scenarios share: a real server, open-loop load, its counters.

* :class:`Server` runs ``python -m batchserve serve --port 0`` in a subprocess (stderr to a
  file, so a chatty server never blocks on a full pipe), waits for its ready line, and reads
  its resident memory from ``/proc`` and its counters from ``/metrics``.
* :func:`run_load` sends an open-loop schedule with the project's load generator
  (:mod:`batchserve.loadgen`): send times come from the schedule, never from answers, and
  latency runs from the scheduled instant. Callbacks can be scheduled at offsets of the run
  (touch a file that stalls the model, send SIGTERM...).
* :class:`RequestCounts` reads the server's request-level outcome counters and checks that
  they add up: ``received == ok + late + rejected + expired + cancelled + failed + invalid``
  (plus what is still in flight).

The tests (short runs, assertions) and ``bench/`` (long runs, tables) both use it.
Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from batchserve.loadgen.config import LoadConfig
from batchserve.loadgen.runner import loop_factory
from batchserve.loadgen.sender import Sender, Share, ShareResult
from batchserve.server.ops.metrics import REQUEST_OUTCOMES
from batchserve_testing.process import process_cpu_s

#: The fault-injecting model, served under the name ``faulty``.
FAULTY = "faulty=batchserve.models.faults:FaultyModel"

#: The request outcomes, in the order of the identity.
OUTCOMES = REQUEST_OUTCOMES


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RequestCounts:
    """The server's request-level counters, from one scrape of ``/metrics``.

    Attributes:
        received: inference requests received.
        in_flight: received and not yet answered.
        by_outcome: outcome -> requests.
        by_reason: reason -> requests (``ok`` included).
    """

    received: int
    in_flight: int
    by_outcome: dict[str, int]
    by_reason: dict[str, int]

    def __getitem__(self, outcome: str) -> int:
        return self.by_outcome.get(outcome, 0)

    @property
    def ended(self) -> int:
        """Requests that reached an outcome."""
        return sum(self.by_outcome.values())

    def check(self) -> None:
        """Raise AssertionError unless every outcome is known and the counters add up."""
        unknown = set(self.by_outcome) - set(OUTCOMES)
        assert not unknown, f"outcomes outside the identity: {unknown}"
        assert self.received == self.ended + self.in_flight, (
            f"received {self.received} != "
            + " + ".join(f"{o} {self[o]}" for o in OUTCOMES)
            + f" + in flight {self.in_flight}"
        )

    def row(self) -> str:
        """One line: every counter."""
        parts = [f"received={self.received}"] + [f"{o}={self[o]}" for o in OUTCOMES]
        return " ".join([*parts, f"in_flight={self.in_flight}"])


@dataclasses.dataclass(frozen=True, slots=True)
class Scrape:
    """One scrape of ``/metrics``: sample name -> list of (labels, value)."""

    samples: dict[str, list[tuple[dict[str, str], float]]]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        """Parse the Prometheus text exposition."""
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        return cls(samples)

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples called ``name`` whose labels include ``labels``."""
        return sum(
            v
            for got, v in self.samples.get(name, [])
            if all(got.get(k) == want for k, want in labels.items())
        )

    def requests(self) -> RequestCounts:
        """The request-level counters."""
        by_outcome: dict[str, int] = {}
        by_reason: dict[str, int] = {}
        for labels, v in self.samples.get("batchserve_requests_total", []):
            by_outcome[labels["outcome"]] = by_outcome.get(labels["outcome"], 0) + int(v)
            by_reason[labels["reason"]] = by_reason.get(labels["reason"], 0) + int(v)
        return RequestCounts(
            received=int(self.value("batchserve_requests_received_total")),
            in_flight=int(self.value("batchserve_requests_in_flight")),
            by_outcome=by_outcome,
            by_reason=by_reason,
        )


class Server:
    """A real ``batchserve serve`` in a subprocess, on 127.0.0.1 and a free port.

    Args:
        args: arguments after ``serve`` (``--model ...`` and batcher flags).
        env: extra environment variables (the fault model's settings).
        log_dir: where the server's stderr goes (a temporary folder by default).
        ready_timeout_s: how long to wait for the ready line.

    Raises:
        RuntimeError: the server did not print its ready line (its stderr is in the message).
    """

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        log_dir: pathlib.Path | None = None,
        ready_timeout_s: float = 60.0,
    ) -> None:
        full_env = dict(os.environ)
        full_env["HF_HUB_OFFLINE"] = "1"
        full_env.update(env or {})
        self._own_dir = log_dir is None
        self.log_dir = (
            pathlib.Path(tempfile.mkdtemp(prefix="batchserve-rel-")) if log_dir is None else log_dir
        )
        self.stderr_path = self.log_dir / f"server-{time.monotonic_ns()}.err"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchserve",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=full_env,
            text=True,
        )
        self.pid = self.proc.pid
        #: ``time.monotonic()`` when the process exited (None while it runs).
        self.exited_at: float | None = None
        threading.Thread(target=self._watch_exit, daemon=True).start()
        line = self._ready_line(ready_timeout_s)
        match = re.match(r"batchserve ready on (http://\S+) models=", line)
        if match is None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            err = self.stderr_path.read_text(errors="replace")
            self.close()
            raise RuntimeError(f"server did not start: {line!r}\n{err}")
        self.url = match.group(1)
        self.port = int(self.url.rsplit(":", 1)[1])
        found = re.search(r" grpc=(\S+)", line)
        #: ``grpc://host:port`` of the gRPC service (``--grpc-port``), else None.
        self.grpc_url = f"grpc://{found.group(1)}" if found else None
        self.client = httpx.Client(base_url=self.url, timeout=10.0)

    def _watch_exit(self) -> None:
        self.proc.wait()
        self.exited_at = time.monotonic()

    def _ready_line(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        timer = _Killer(self.proc, timeout_s)
        try:
            return self.proc.stdout.readline()
        finally:
            timer.cancel()

    # -- observing -------------------------------------------------------------------------

    def rss_bytes(self) -> int:
        """The server process's resident memory now, in bytes (from ``/proc``)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc status")

    def cpu_s(self) -> float:
        """CPU seconds the server process has used so far, user and system (``/proc``)."""
        return process_cpu_s(self.pid)

    def scrape(self) -> Scrape:
        """One scrape of ``/metrics``."""
        res = self.client.get("/metrics")
        res.raise_for_status()
        return Scrape.parse(res.text)

    def counts(self) -> RequestCounts:
        """The request-level counters now."""
        return self.scrape().requests()

    def settled_counts(self, timeout_s: float = 5.0) -> RequestCounts:
        """The counters once nothing is in flight (at most ``timeout_s``), checked to add up."""
        counts = self.counts()
        end = time.monotonic() + timeout_s
        while counts.in_flight and time.monotonic() < end:
            time.sleep(0.02)
            counts = self.counts()
        counts.check()
        return counts

    def healthy(self) -> bool:
        """Whether the server is alive and ready (``/v2/health/ready`` answers 200)."""
        try:
            return self.client.get("/v2/health/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def stderr_text(self) -> str:
        """What the server wrote to stderr so far."""
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    # -- ending ----------------------------------------------------------------------------

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to the server process."""
        self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status, or None if it is still running after ``timeout_s``."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Kill the server if it still runs; release the client and the log file.

        The log's temporary folder is removed (one given as ``log_dir`` is the caller's).
        """
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if hasattr(self, "client"):
            self.client.close()
        self._stderr.close()
        if self._own_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)


class _Killer:
    """Kills a process that has not printed its ready line in time."""

    def __init__(self, proc: subprocess.Popen[str], timeout_s: float) -> None:
        self._timer = threading.Timer(timeout_s, proc.kill)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()


@contextlib.contextmanager
def serve(
    args: Sequence[str], env: dict[str, str] | None = None, **kwargs: Any
) -> Iterator[Server]:
    """A :class:`Server` for the ``with`` block; killed at the end if still running."""
    server = Server(args, env, **kwargs)
    try:
        yield server
    finally:
        server.close()


@dataclasses.dataclass(frozen=True, slots=True)
class LoadRun:
    """The records of one open-loop run, one slot per scheduled request.

    Attributes:
        config: what was sent.
        result: the load generator's raw records.
    """

    config: LoadConfig
    result: ShareResult

    @property
    def n(self) -> int:
        """Requests scheduled."""
        return len(self.result.status)

    @property
    def status(self) -> list[int]:
        """HTTP status per request (0: no response)."""
        return self.result.status

    def reason(self, i: int) -> str:
        """``X-Reason`` (or the client's reason) of request ``i``; "" for a success."""
        return self.result.reasons.get(i, "")

    def response_s(self, i: int) -> float:
        """Seconds from writing request ``i`` to its answer (NaN without one)."""
        return self.result.latency_s[i] - self.result.lag_s[i]

    def server_s(self, i: int) -> float:
        """The server's own account of request ``i``: arrival to answer (NaN without one)."""
        server = self.result.server_s
        return server[i] if server else math.nan

    def latency_s(self, i: int) -> float:
        """Seconds from request ``i``'s scheduled instant to its answer."""
        return self.result.latency_s[i]

    def indices(self, status: int) -> list[int]:
        """The requests answered with ``status``."""
        return [i for i, s in enumerate(self.result.status) if s == status]

    def count(self, status: int) -> int:
        """How many requests were answered with ``status``."""
        return sum(1 for s in self.result.status if s == status)

    def statuses(self) -> dict[int, int]:
        """Status -> count."""
        out: dict[int, int] = {}
        for s in self.result.status:
            out[s] = out.get(s, 0) + 1
        return dict(sorted(out.items()))

    def text(self, i: int) -> str:
        """The (first) text request ``i`` carried."""
        texts = self.config.texts
        return texts[(i * self.config.inputs_per_request) % len(texts)]


def run_load(
    config: LoadConfig,
    *,
    events: Sequence[tuple[float, Callable[[], None]]] = (),
    max_connections: int = 2000,
) -> LoadRun:
    """Send ``config``'s schedule open loop from this process and wait for every answer.

    Args:
        config: the run (its ``timeout_s`` is sent as ``X-Request-Timeout``).
        events: ``(offset_s, callback)`` pairs: each callback runs on the sender's loop at
            that offset from the start (it must be quick: touching a file, a signal).
        max_connections: the cap on open connections.

    Blocks until every request is answered or abandoned (``config.give_up_s`` after its
    scheduled instant).
    """
    offsets = config.schedule()
    share = Share(
        config=config,
        offsets=offsets,
        indices=list(range(len(offsets))),
        max_connections=max_connections,
    )

    async def main() -> ShareResult:
        sender = Sender(share)
        await sender.prepare()
        loop = asyncio.get_running_loop()
        start_at = time.monotonic() + 0.05
        handles = [loop.call_later(start_at - time.monotonic() + off, fn) for off, fn in events]
        try:
            return await sender.run(start_at)
        finally:
            for h in handles:
                h.cancel()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return LoadRun(config, runner.run(main()))


def unique_texts(n: int, prefix: str = "text") -> tuple[str, ...]:
    """``n`` distinct texts, so each request of a run can be told apart."""
    return tuple(f"{prefix}-{i:07d}" for i in range(n))
