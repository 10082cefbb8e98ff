"""Start, probe and stop the servers that the comparison lays side by side.

Every server runs in its own process group (``start_new_session``), on 127.0.0.1, with the
same HTTP contract: ``POST /v1/embeddings`` with ``{"model": ..., "input": "text"}``.

* ``batchserve`` runs from the project's ``.venv`` with ``--port 0`` and prints its URL in a
  ready line, which is read from its output;
* each peer (``litserve``, ``mosec``, ``rayserve``, ``fastapi``) runs its script from
  ``bench/peers/`` with its own ``bench/.venvs/<peer>/bin/python`` on a port picked here,
  and writes its batch counters to a JSON file that :meth:`Running.batch_counters` reads.

A server is ready when one request through the contract answers 200. Stopping sends SIGTERM
to the group, waits, then SIGKILL: nothing outlives the cell.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from batchserve_testing.bench import BENCH, ROOT, free_port, process_cpu_s

__all__ = [
    "BENCH",
    "MAIN_PYTHON",
    "MODEL_NAME",
    "PEERS",
    "REAL_MODELS_ONLY",
    "ROOT",
    "SERVERS",
    "VENVS",
    "Knobs",
    "ModelSpec",
    "Running",
    "available",
    "command",
    "describe",
    "server_env",
    "start",
]

PEERS_DIR = BENCH / "peers"
VENVS = BENCH / ".venvs"
MAIN_PYTHON = ROOT / ".venv" / "bin" / "python"

SERVERS = (
    "batchserve",
    "litserve",
    "mosec",
    "rayserve",
    "infinity",
    "infinity-onnx",
    "infinity-int8",
    "infinity-onnx-int8",
    "fastapi",
)
PEERS = SERVERS[1:]
PEER_SCRIPT = {
    "litserve": "litserve_server.py",
    "mosec": "mosec_server.py",
    "rayserve": "rayserve_server.py",
    "infinity": "infinity_server.py",
    "fastapi": "fastapi_server.py",
}
#: A peer run another way: (its environment and script, the extra flags its script takes).
#: Infinity's engines and precisions, each a peer of its own so a run reports each at its
#: best: ONNX Runtime through optimum (on its own export of the shipped weights),
#: torch with its int8 (dynamic quantization on the CPU), and ONNX Runtime on a
#: dynamically quantized int8 file (what its ONNX engine picks on a CPU where one is there).
PEER_VARIANTS: dict[str, tuple[str, list[str]]] = {
    "infinity-onnx": ("infinity", ["--engine", "optimum", "--dtype", "float32"]),
    "infinity-int8": ("infinity", ["--engine", "torch", "--dtype", "int8"]),
    "infinity-onnx-int8": ("infinity", ["--engine", "optimum", "--dtype", "int8"]),
}


def _base(server: str) -> str:
    return PEER_VARIANTS[server][0] if server in PEER_VARIANTS else server


MODEL_NAME = "bench"
READY_TIMEOUT_S = {"rayserve": 240.0}
DEFAULT_READY_TIMEOUT_S = 120.0

_URL = re.compile(r"https?://127\.0\.0\.1:(\d+)")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """The model every server serves in a cell.

    Attributes:
        kind: ``sleep`` (the seed's synthetic model), ``null`` (returns at once), ``minilm``.
        fixed_ms: sleep model, cost per call.
        per_item_ms: sleep model, cost per item.
    """

    kind: str
    fixed_ms: float = 8.0
    per_item_ms: float = 0.25

    def batchserve_spec(self) -> str:
        """The ``--model`` SPEC that batchserve takes for this model."""
        if self.kind == "minilm":
            return "minilm"
        if self.kind == "null":
            return "synthetic:fixed=0ms,per_item=0ms"
        return f"synthetic:fixed={self.fixed_ms:g}ms,per_item={self.per_item_ms:g}ms"


@dataclass(frozen=True, slots=True, kw_only=True)
class Knobs:
    """The batching settings of a cell, the same for every server.

    Attributes:
        max_batch: items per forward pass at most.
        max_wait_ms: how long the oldest request may wait for a batch to fill.
        queue_size: requests that may wait (servers that have such a bound).
        timeout_ms: batchserve's default deadline (the generator also sends one per request).
        extra: more flags for ``batchserve serve`` (peers ignore them).
    """

    max_batch: int
    max_wait_ms: float
    queue_size: int
    timeout_ms: float = 30_000.0
    extra: tuple[str, ...] = ()


def command(server: str, model: ModelSpec, knobs: Knobs, port: int, stats: Path) -> list[str]:
    """The command line that starts ``server`` (port 0 for batchserve)."""
    if server == "batchserve":
        return [
            str(MAIN_PYTHON),
            "-m",
            "batchserve",
            "serve",
            "--model",
            f"{MODEL_NAME}={model.batchserve_spec()}",
            "--max-batch-size",
            str(knobs.max_batch),
            "--max-wait",
            f"{knobs.max_wait_ms:g}ms",
            "--queue-size",
            str(knobs.queue_size),
            "--timeout",
            f"{knobs.timeout_ms:g}ms",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *knobs.extra,
        ]
    base = _base(server)
    return [
        str(VENVS / base / "bin" / "python"),
        str(PEERS_DIR / PEER_SCRIPT[base]),
        *(PEER_VARIANTS[server][1] if server in PEER_VARIANTS else []),
        "--port",
        str(port),
        "--model",
        model.kind,
        "--fixed-ms",
        f"{model.fixed_ms:g}",
        "--per-item-ms",
        f"{model.per_item_ms:g}",
        "--max-batch",
        str(knobs.max_batch),
        "--max-wait-ms",
        f"{knobs.max_wait_ms:g}",
        "--queue-size",
        str(knobs.queue_size),
        "--stats-file",
        str(stats),
    ]


#: Peers that serve only real models (the MiniLM scenario).
REAL_MODELS_ONLY = frozenset({"infinity", *PEER_VARIANTS})


def available(server: str, model: ModelSpec | None = None) -> str | None:
    """None if ``server`` can be started here (for ``model``), else why not."""
    if model is not None and model.kind != "minilm" and server in REAL_MODELS_ONLY:
        return f"{server} serves real models only"
    if server == "batchserve":
        return None if MAIN_PYTHON.exists() else f"{MAIN_PYTHON} is missing"
    python = VENVS / _base(server) / "bin" / "python"
    if not python.exists():
        return f"{python} is missing: run python bench/peers/setup.py"
    return None


def server_env() -> dict[str, str]:
    """The environment every server runs with: offline, quiet, no telemetry."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
    )
    env.pop("VIRTUAL_ENV", None)
    return env


@dataclass(slots=True, kw_only=True)
class Running:
    """A started server.

    Attributes:
        name: the server's name.
        argv: its command line.
        proc: its process (the leader of its own process group).
        url: its base URL, once known.
        stats: the peer's batch counter file (unused for batchserve).
        log: the file that collects its output.
    """

    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    url: str
    stats: Path
    log: Path
    _threads: list[threading.Thread] = field(default_factory=list)

    def cpu_s(self) -> float:
        """CPU seconds (user and system) the server's live processes have used so far.

        The process and every descendant (Mosec's Rust front end and its Python workers,
        LitServe's workers), each counted from its start.
        """
        return sum(process_cpu_s(p) for p in [self.proc.pid, *_descendants(self.proc.pid)])

    def batch_counters(self) -> tuple[int, int]:
        """(forward passes, items) so far; (0, 0) if not known yet.

        batchserve: from its ``/metrics`` (``batchserve_batch_size`` count and sum); a peer:
        from the counter file its model writes.
        """
        if self.name == "batchserve":
            m = self.metrics()
            return int(m.get("batchserve_batch_size_count", 0)), int(
                m.get("batchserve_batch_size_sum", 0)
            )
        try:
            data = json.loads(self.stats.read_text())
        except (OSError, ValueError):
            return (0, 0)
        return int(data["batches"]), int(data["items"])

    def metrics(self) -> dict[str, float]:
        """batchserve's Prometheus samples summed over labels but ``outcome``; {} on failure.

        Keys are sample names, with ``[outcome]`` appended where the sample has one.
        """
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except (urllib.error.URLError, OSError, TimeoutError):
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if not m:
                continue
            name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
            o = re.search(r'outcome="([^"]*)"', labels)
            key = f"{name}[{o.group(1)}]" if o else name
            out[key] = out.get(key, 0.0) + value
        return out

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the process group, wait up to ``timeout_s``, then SIGKILL what is left.

        What is left: the group, and every descendant of the server seen before the
        SIGTERM (Ray's daemons and LitServe's or Mosec's workers may sit in other groups
        or outlive their parent).
        """
        family = _descendants(self.proc.pid)
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)
        _signal_group(self.proc.pid, signal.SIGKILL)
        for pid, started in family.items():
            if _start_time(pid) == started:  # the same process, not a reused id
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        for t in self._threads:
            t.join(timeout=1)


def _start_time(pid: int) -> str | None:
    """The start time field of ``/proc/PID/stat`` (None if the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _descendants(root: int) -> dict[int, str]:
    """Every live descendant of ``root``, by pid, with its start time."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        started = _start_time(pid)
        if started is not None:
            out[pid] = started
        todo.extend(children.get(pid, []))
    return out


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _pump(stream: object, log: Path, found: list[str], event: threading.Event) -> None:
    with open(log, "ab") as out:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            out.write(raw)
            out.flush()
            if not found:
                m = _URL.search(raw.decode("utf-8", "replace"))
                if m:
                    found.append(m.group(1))
                    event.set()


def start(
    server: str,
    model: ModelSpec,
    knobs: Knobs,
    *,
    logs: Path,
    tag: str,
    argv: list[str] | None = None,
    env: dict[str, str] | None = None,
    model_name: str = MODEL_NAME,
    ready_s: float | None = None,
) -> Running:
    """Start ``server`` and wait until it answers a request.

    ``argv`` replaces the command :func:`command` would build (a batchserve command must
    take ``--port 0`` and print its URL); ``env`` adds to :func:`server_env`; the readiness
    probe asks for ``model_name``, for up to ``ready_s`` (default: the server's own limit).

    Raises:
        RuntimeError: it exited, or did not answer within its readiness timeout; the
            message ends with the last lines of its log.
    """
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{tag}-{server}.log"
    stats = logs / f"{tag}-{server}.stats.json"
    for p in (log, stats):
        p.unlink(missing_ok=True)
    port = 0 if server == "batchserve" else free_port()
    if argv is None:
        argv = command(server, model, knobs, port, stats)
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**server_env(), **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    found: list[str] = []
    event = threading.Event()
    pump = threading.Thread(target=_pump, args=(proc.stdout, log, found, event), daemon=True)
    pump.start()
    run = Running(name=server, argv=argv, proc=proc, url="", stats=stats, log=log)
    run._threads.append(pump)
    if ready_s is None:
        ready_s = READY_TIMEOUT_S.get(server, DEFAULT_READY_TIMEOUT_S)
    limit = time.monotonic() + ready_s
    try:
        if server == "batchserve":
            while not event.wait(0.1):
                _check_alive(run, limit)
            port = int(found[0])
        run.url = f"http://127.0.0.1:{port}"
        while not _answers(run.url, model_name):
            _check_alive(run, limit)
            time.sleep(0.25)
    except BaseException:
        run.stop(timeout_s=5)
        raise
    return run


def _check_alive(run: Running, limit: float) -> None:
    why = None
    if run.proc.poll() is not None:
        why = f"exited with status {run.proc.returncode}"
    elif time.monotonic() > limit:
        why = "did not answer in time"
    if why:
        tail = "".join(run.log.read_text(errors="replace").splitlines(True)[-15:])
        raise RuntimeError(f"{run.name} {why}; last lines of {run.log}:\n{tail}")


def _answers(url: str, model_name: str = MODEL_NAME) -> bool:
    body = json.dumps({"model": model_name, "input": "ready?"}).encode()
    req = urllib.request.Request(
        f"{url}/v1/embeddings", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


def describe(argv: list[str]) -> str:
    """A command line as a reader would type it, paths relative to the repository."""
    out = []
    for a in argv:
        if a.startswith(str(ROOT) + os.sep):
            a = os.path.relpath(a, ROOT)
        out.append(a)
    return " ".join(out)
