"""The comparison's ``real`` scenario: MiniLM on real paragraphs, batchserve beside its peers.

The question: on real texts of mixed length, sent the two ways users send them, how many
texts per second does each server (or in-process library) embed at its best, on one
machine, in one run, and how does that compare with the simplest thing a user could do?

**Texts**: the paragraphs of Python's own reference manual (``pydoc_data.topics``, which
ships with every CPython): each topic split at blank lines, whitespace collapsed, paragraphs
under three words (headings, labels) and repeats dropped, then shuffled with a fixed seed
(an indexer's documents come in no particular order of length). The same sequence goes to
every contender, from its start: a time-bounded run covers a prefix of it, a random sample
of the manual whose length is the run's business. Every engine truncates at the model's
limit (256 tokens for sentence-transformers, batchserve and fastembed; Infinity's ONNX
engine tokenizes up to the config's 512, so it computes more on the few longest).

**Contenders**, each started alone and stopped before the next:

* ``batchserve``: ``batchserve serve`` with no flag but its address, as ``scripts/serve``
  runs it (``--backend auto``: the engine its verdict picked, read from ``/status``);
* ``batchserve-torch``: the same pinned to ``--backend torch --dtype float32``;
* ``baseline`` (with ``--baseline-src DIR``): ``batchserve serve`` as the first, run from
  another source tree (``PYTHONPATH=DIR``) with a cache of its own: before and after, side
  by side;
* ``infinity``, ``infinity-onnx``, ``infinity-int8``, ``infinity-onnx-int8``: Infinity's
  engines (torch float32, ONNX Runtime through optimum, torch dynamic int8, ONNX Runtime on
  a dynamically quantized file), each at every ``--infinity-batches`` (its ``--batch-size``),
  the best of the batch shape kept for the rest;
* ``fastembed`` (in process, its own venv): ONNX Runtime on batchserve's ONNX export of the
  same weights, each request's texts passed to ``embed`` at every ``--fastembed-batches``,
  as given and sorted by length within the request; the best kept;
* ``yardstick`` (in process): ``SentenceTransformer.encode`` on each request's texts, one
  padded batch, torch float32, as a user's own loop would do it; measured first and again
  last, the better of the two kept (a slow moment of the machine must not inflate every
  ratio).

Every contender uses every core (``os.cpu_count()`` threads for the in-process ones and
Infinity's torch default; batchserve its own default split into workers and threads).

**Shapes**:

1. *batch*: ``--per-request`` texts (32) per request, closed loop on ``--connections``
   kept-alive connections (2: the next request is always waiting while one is computed, as
   an indexer with a little concurrency sends them), for ``--real-seconds``: texts/s, and
   a request's p50 and p99;
2. *one text per request*, open loop (Poisson arrivals, the project's generator, 2 s
   deadline that the caller keeps too): *past saturation*, offered ``--overload`` (2x) the
   contender's own batch-shape texts/s: goodput (answers within the deadline per second),
   p50, p99; then *at half capacity*, half that goodput offered (or ``--real-half-rate``,
   one rate for all: today's half capacity, say): p50 and p99.
   The in-process contenders have no requests to queue and run only the batch shape.

Order of events: texts written, the in-process contenders, then each server: started,
warmed (a few requests of each shape, not counted), the batch shape (once per Infinity
batch size, each a fresh start, then the best restarted), past saturation, a wait until a
one-text request is as fast as on the idle server (a backlog worked off), half capacity,
stopped; last, the yardstick again. The record (every figure, the commands, the engines and
start times) goes in the run's raw JSON under ``extra.real``; :func:`table` prints it
with the ratios: batch-shape texts/s against the yardstick and against batchserve, goodput
against the baseline when one ran (else batchserve).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from batchserve_testing import closed_loop as closed_loop_client
from comparison.servers import (
    BENCH,
    MAIN_PYTHON,
    MODEL_NAME,
    ROOT,
    VENVS,
    Knobs,
    ModelSpec,
    Running,
    available,
    describe,
    server_env,
    start,
)

__all__ = [
    "IN_PROCESS",
    "REAL_SERVERS",
    "RealPlan",
    "reference",
    "reference_paragraphs",
    "run",
    "summary_rows",
    "table",
]

#: The served contenders this scenario knows, in the order they run.
REAL_SERVERS = (
    "batchserve",
    "batchserve-torch",
    "baseline",
    "infinity",
    "infinity-onnx",
    "infinity-int8",
    "infinity-onnx-int8",
)
#: In-process contenders (no server).
IN_PROCESS = ("yardstick", "fastembed")
TEXTS_FILE = BENCH / "out" / "real-texts.txt"
DEADLINE_MS = 2000.0
MIN_WORDS = 3
SHUFFLE_SEED = 0
BATCHSERVE_MODEL = "all-MiniLM-L6-v2"
#: How long a batchserve start may take: with ``--backend auto``, the first start on a
#: machine (or with a fresh cache) measures every engine before it answers.
BATCHSERVE_READY_S = 1800.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RealPlan:
    """How the scenario runs.

    Attributes:
        seconds: each measured run (batch shape, past saturation, half capacity).
        per_request: texts per request in the batch shape.
        connections: kept-alive connections of the batch shape's closed loop.
        overload: one-text rate offered past saturation, x the batch shape's texts/s.
        infinity_batches: Infinity's ``--batch-size`` values tried.
        fastembed_batches: fastembed's ``batch_size`` values tried.
        baseline_src: another source tree's ``src`` to run as ``baseline`` ('' for none).
        baseline_cache: the baseline's cache directory (its own verdict and exports).
        half_rate: one text per request, the rate of the run at half capacity, the same
            for every contender (0: half of each one's own goodput past saturation).
        warmup_s: not counted, after each start.
    """

    seconds: float
    per_request: int = 32
    connections: int = 2
    overload: float = 2.0
    infinity_batches: tuple[int, ...] = (8, 16, 32, 64)
    fastembed_batches: tuple[int, ...] = (8, 16, 32)
    baseline_src: str = ""
    baseline_cache: str = str(BENCH / "out" / "baseline-cache")
    half_rate: float = 0.0
    warmup_s: float = 2.0


# ---------------------------------------------------------------- texts


def reference_paragraphs() -> tuple[str, ...]:
    """The paragraphs of Python's reference manual, in the manual's order.

    ``batchserve.loadgen.texts.reference_paragraphs`` when the library has it (the same
    texts the gate and the tests use), else this module's own reading of the same source.
    """
    from batchserve.loadgen import texts as library

    if hasattr(library, "reference_paragraphs"):
        return tuple(library.reference_paragraphs())
    from pydoc_data.topics import topics

    seen: dict[str, None] = {}
    for key in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[key]):
            text = " ".join(block.split())
            if len(text.split()) >= MIN_WORDS:
                seen.setdefault(text, None)
    return tuple(seen)


def write_texts() -> list[str]:
    """Shuffle the paragraphs (fixed seed), write them to TEXTS_FILE; the sequence."""
    texts = list(reference_paragraphs())
    random.Random(SHUFFLE_SEED).shuffle(texts)
    TEXTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    TEXTS_FILE.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return texts


def _describe_texts(texts: list[str]) -> dict[str, Any]:
    words = sorted(len(t.split()) for t in texts)
    return {
        "source": "pydoc_data.topics (Python's reference manual), paragraphs",
        "count": len(texts),
        "words_mean": round(statistics.mean(words), 1),
        "words_median": statistics.median(words),
        "words_p90": words[int(0.9 * (len(words) - 1))],
        "words_max": words[-1],
        "file": str(TEXTS_FILE.relative_to(ROOT)),
    }


# ---------------------------------------------------------------- in process


def _json_of(argv: list[str], timeout_s: float) -> dict[str, Any]:
    res = subprocess.run(
        argv, cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=timeout_s
    )
    if res.returncode != 0:
        raise RuntimeError(f"{describe(argv[:3])} exited {res.returncode}: {res.stderr[-1500:]}")
    data: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return data


def yardstick(plan: RealPlan) -> dict[str, Any]:
    """``SentenceTransformer.encode`` on each request's texts, one padded batch.

    :mod:`batchserve_testing.encode_alone` in a process of its own, going round the
    requests for ``plan.seconds``.
    """
    threads = os.cpu_count() or 1
    per = str(plan.per_request)
    argv = [str(MAIN_PYTHON), "-m", "batchserve_testing.encode_alone", str(TEXTS_FILE)]
    argv += ["--threads", str(threads), "--batch-sizes", per, "--per-call", per]
    argv += ["--seconds", f"{plan.seconds:g}", "--normalize"]
    (row,) = _json_of(argv, plan.seconds + 300)["rows"]
    return {
        "name": "yardstick",
        "config": f"encode, fp32, {threads} threads",
        "batch": {"texts_per_s": round(row["items_per_s"], 1), "requests": row["calls"]},
    }


def fastembed(plan: RealPlan) -> dict[str, Any]:
    """fastembed on batchserve's ONNX export, each request on its own: the best setting."""
    python = VENVS / "fastembed" / "bin" / "python"
    if not python.exists():
        return {"name": "fastembed", "error": f"{python} is missing: run bench/peers/setup.py"}
    from batchserve.engines.embeddings import builtin_path
    from batchserve.engines.export import ensure_exported
    from batchserve.engines.runtime import default_cache_dir

    exported = ensure_exported(builtin_path(), "onnx", default_cache_dir())
    threads = os.cpu_count() or 1
    argv = [
        str(python),
        str(BENCH / "peers" / "fastembed_encode.py"),
        *("--model-file", str(exported.model_file), "--source", str(builtin_path())),
        *("--texts", str(TEXTS_FILE), "--threads", str(threads)),
        *("--batch-sizes", ",".join(map(str, plan.fastembed_batches))),
        *("--per-request", str(plan.per_request), "--seconds", f"{plan.seconds:g}"),
    ]
    sweep = _json_of(argv, 2 * len(plan.fastembed_batches) * (plan.seconds + 60) + 120)
    best = max(sweep, key=lambda k: sweep[k])
    return {
        "name": "fastembed",
        "config": best,
        "sweep": {k: round(v, 1) for k, v in sweep.items()},
        "batch": {"texts_per_s": round(sweep[best], 1)},
        "command": describe(argv),
    }


# ---------------------------------------------------------------- served


def closed_loop(
    url: str, model: str, texts: list[str], plan: RealPlan, seconds: float
) -> dict[str, Any]:
    """Batch shape: requests of ``per_request`` texts on kept-alive connections.

    Each connection takes the next request of the sequence as soon as its last one is
    answered, until ``seconds`` passed; texts/s counts the texts of answered requests over
    the wall time until the last answer (:func:`batchserve_testing.closed_loop.embeddings`).

    Raises:
        RuntimeError: a request was not answered 200 with one vector per text.
    """
    n = plan.per_request
    requests = [texts[i : i + n] for i in range(0, len(texts), n)]
    loop = closed_loop_client.embeddings(
        url, model, requests, connections=plan.connections, seconds=seconds
    )
    lat = loop.latencies_s
    return {
        "texts_per_s": round(loop.texts_per_s, 1),
        "requests": loop.requests,
        "p50_ms": round(1e3 * loop.quantile_s(0.5), 1) if lat else None,
        "p99_ms": round(1e3 * loop.quantile_s(0.99), 1) if lat else None,
        "wall_s": round(loop.wall_s, 2),
    }


def open_loop(url: str, model: str, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """One text per request, Poisson arrivals at ``rate``: the generator's summary.

    Raises:
        RuntimeError: the generator printed no JSON summary.
    """
    argv = [
        *(str(MAIN_PYTHON), "-m", "batchserve", "load", url, "--api", "openai"),
        *("--model", model, "--texts", str(TEXTS_FILE), "--arrivals", "poisson"),
        *("--rate", f"{rate:g}", "--duration", f"{seconds:g}s"),
        *("--timeout", f"{DEADLINE_MS:g}ms", "--client-timeout", f"{DEADLINE_MS:g}ms"),
        *("--seed", str(seed), "--json", "--quiet"),
    ]
    res = subprocess.run(
        argv,
        cwd=ROOT,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=seconds + 180,
        check=False,
    )
    for line in reversed(res.stdout.strip().splitlines()):
        if line.startswith("{"):
            s: dict[str, Any] = json.loads(line)
            keys = ("ok_per_s", "p50_ms", "p99_ms", "sent", "ok", "rejected", "timed_out")
            out = {k: s.get(k) for k in keys}
            out.update(offered_per_s=round(rate, 1), errors=s.get("errors"))
            if s.get("warnings"):
                out["warnings"] = s["warnings"]
            return out
    raise RuntimeError(f"generator exited {res.returncode}: {res.stderr[-1500:]}")


def _batchserve_argv(name: str) -> list[str]:
    argv = [str(MAIN_PYTHON), "-m", "batchserve", "serve", "--host", "127.0.0.1", "--port", "0"]
    if name == "batchserve-torch":
        argv += ["--backend", "torch", "--dtype", "float32"]
    return argv


def _engine(run: Running) -> dict[str, Any]:
    try:
        conn = http.client.HTTPConnection(run.url.removeprefix("http://"), timeout=30)
        conn.request("GET", "/status")
        status = json.loads(conn.getresponse().read())
        conn.close()
        model = status["models"][BATCHSERVE_MODEL]
    except (OSError, ValueError, KeyError):
        return {}
    engine = model.get("engine") or {}
    out = {k: engine[k] for k in ("backend", "precision", "threads") if k in engine}
    workers = (model.get("settings") or {}).get("workers")
    if workers is not None:
        out["workers"] = workers
    return out


class _Server:
    """Starts one served contender (at one Infinity batch size) and knows its model name."""

    def __init__(self, name: str, plan: RealPlan, logs: Path) -> None:
        self.name = name
        self.plan = plan
        self.logs = logs
        self.batchserve = name.startswith("batchserve") or name == "baseline"
        self.model = BATCHSERVE_MODEL if self.batchserve else MODEL_NAME

    def start(self, batch: int | None) -> Running:
        tag = f"real-{self.name}" + (f"-b{batch}" if batch else "")
        spec = ModelSpec(kind="minilm")
        if not self.batchserve:
            knobs = Knobs(max_batch=batch or 32, max_wait_ms=2.0, queue_size=1024)
            return start(self.name, spec, knobs, logs=self.logs, tag=tag)
        env: dict[str, str] = {}
        if self.name == "baseline":
            env = {"PYTHONPATH": self.plan.baseline_src}
            env["BATCHSERVE_CACHE_DIR"] = self.plan.baseline_cache
        knobs = Knobs(max_batch=32, max_wait_ms=2.0, queue_size=1024)
        argv = _batchserve_argv(self.name)
        return start(
            "batchserve",
            spec,
            knobs,
            logs=self.logs,
            tag=tag,
            argv=argv,
            env=env,
            model_name=self.model,
            ready_s=BATCHSERVE_READY_S,
        )

    def warm(self, run: Running, texts: list[str]) -> None:
        closed_loop(run.url, self.model, texts, self.plan, self.plan.warmup_s)
        open_loop(run.url, self.model, 5.0, self.plan.warmup_s, seed=999)


def served(name: str, texts: list[str], plan: RealPlan, logs: Path) -> dict[str, Any]:
    """One served contender through both shapes (its batch sweep first for Infinity)."""
    server = _Server(name, plan, logs)
    rec: dict[str, Any] = {"name": name}
    batches: tuple[int | None, ...] = (None,) if server.batchserve else plan.infinity_batches
    sweep: dict[str, Any] = {}
    best: int | None = None
    run = None
    try:
        for batch in batches:
            t0 = time.monotonic()
            run = server.start(batch)
            rec.setdefault("start_s", []).append(round(time.monotonic() - t0, 1))
            rec["command"] = describe(run.argv)
            if server.batchserve:
                rec["engine"] = _engine(run)
            server.warm(run, texts)
            row = closed_loop(run.url, server.model, texts, plan, plan.seconds)
            sweep[str(batch or "default")] = row
            print(f"  {name:<18} batch shape{_at(batch)}: {row['texts_per_s']:.1f} texts/s")
            if best is None or row["texts_per_s"] > sweep[str(best)]["texts_per_s"]:
                best = batch
            if len(batches) > 1 and batch != batches[-1]:
                run.stop()
                run = None
        if run is None or best != batches[-1]:
            if run is not None:
                run.stop()
            run = server.start(best)
            rec["command"] = describe(run.argv)
            server.warm(run, texts)
        rec["batch_size"] = best
        rec["batch"] = sweep[str(best or "default")]
        if len(batches) > 1:
            rec["sweep"] = {b: r["texts_per_s"] for b, r in sweep.items()}
        rate = plan.overload * rec["batch"]["texts_per_s"]
        idle_s = _probe(run.url, server.model)
        rec["saturated"] = open_loop(run.url, server.model, rate, plan.seconds, seed=1)
        rec["backlog_s"] = _drained(run.url, server.model, idle_s)
        half = plan.half_rate or max(1.0, 0.5 * (rec["saturated"]["ok_per_s"] or 0.0))
        rec["half"] = open_loop(run.url, server.model, half, plan.seconds, seed=2)
        for key in ("saturated", "half"):
            r = rec[key]
            print(
                f"  {name:<18} one text, {key:9} offered {r['offered_per_s']:7.1f}/s: "
                f"ok {r['ok_per_s']:6.1f}/s  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms  "
                f"rejected {r['rejected']}  timed out {r['timed_out']}",
                flush=True,
            )
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
        print(f"  {name:<18} FAILED: {rec['error'][:400]}", flush=True)
    finally:
        if run is not None:
            run.stop()
    return rec


def _probe(url: str, model: str) -> float:
    """Seconds one request of one text takes now (the best of three answered; inf if none)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": model, "input": "how long does one text take?"})
    best = float("inf")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        for _ in range(3):
            t0 = time.perf_counter()
            conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status == 200:  # a refusal is quick, and says nothing of the backlog
                best = min(best, time.perf_counter() - t0)
    finally:
        conn.close()
    return best


def _drained(url: str, model: str, idle_s: float, limit_s: float = 180.0) -> float:
    """Wait until a probe is about as fast as on the idle server; the seconds waited.

    A server without a bound on its queue (Infinity) may still be working off requests its
    callers gave up on; the next run must not inherit them.
    """
    t0 = time.monotonic()
    time.sleep(1.0)
    while time.monotonic() - t0 < limit_s and _probe(url, model) > max(3 * idle_s, idle_s + 0.05):
        time.sleep(1.0)
    return round(time.monotonic() - t0, 1)


def _at(batch: int | None) -> str:
    return f" (--batch-size {batch})" if batch else ""


# ---------------------------------------------------------------- the scenario


def run(plan: RealPlan, servers: list[str], logs: Path) -> dict[str, Any]:
    """Every contender in turn: the scenario's record (see the module's docstring)."""
    texts = write_texts()
    record: dict[str, Any] = {"plan": asdict(plan), "texts": _describe_texts(texts), "rows": []}
    t = record["texts"]
    print(
        f"  texts: {t['count']} paragraphs of Python's reference manual, words mean "
        f"{t['words_mean']}, median {t['words_median']}, p90 {t['words_p90']}",
        flush=True,
    )
    for name, measure in (("yardstick", yardstick), ("fastembed", fastembed)):
        if name in servers:
            record["rows"].append(_in_process(name, measure, plan))
    for name in REAL_SERVERS:
        if name not in servers or (name == "baseline" and not plan.baseline_src):
            continue
        why = None if name in ("batchserve-torch", "baseline") else available(name)
        if why is not None:
            record["rows"].append({"name": name, "error": why})
            print(f"  {name:<18} skipped: {why}", flush=True)
            continue
        record["rows"].append(served(name, texts, plan, logs))
    first = next((r for r in record["rows"] if r["name"] == "yardstick"), None)
    if first is not None and "error" not in first:
        # Again at the end (the machine's noise moves): the better of the two is the
        # yardstick, so that a slow moment of the machine cannot inflate every ratio.
        again = _in_process("yardstick", yardstick, plan)
        if "error" not in again:
            runs = [first["batch"]["texts_per_s"], again["batch"]["texts_per_s"]]
            first["runs"] = runs
            first["batch"] = max(first["batch"], again["batch"], key=lambda b: b["texts_per_s"])
    return record


def _in_process(name: str, measure: Any, plan: RealPlan) -> dict[str, Any]:
    try:
        row: dict[str, Any] = measure(plan)
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
        row = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
    figure = row.get("batch", {}).get("texts_per_s")
    print(f"  {name:<18} batch shape: {figure} texts/s  {row.get('error', '')}", flush=True)
    return row


def _figure(row: dict[str, Any] | None, *path: str) -> float | None:
    """The number at ``path`` in ``row``, to 0.1 (None where there is none)."""
    value: Any = row
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return round(float(value), 1) if isinstance(value, (int, float)) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def _how(r: dict[str, Any]) -> str:
    how = str(r.get("config", ""))
    if r.get("runs"):
        how += " (best of " + ", ".join(f"{x:g}" for x in r["runs"]) + ")"
    if r.get("engine"):
        e = r["engine"]
        how = f"{e.get('backend', '?')}/{e.get('precision', '?')}"
        if "workers" in e or "threads" in e:
            how += f", {e.get('workers', '?')}x{e.get('threads', '?')} threads"
    elif r.get("batch_size"):
        how = f"--batch-size {r['batch_size']}"
    if r.get("start_s"):
        how += f", start {r['start_s'][0]:.0f} s"
    return how


def reference(record: dict[str, Any]) -> str:
    """The contender one-text goodput is compared with: ``baseline`` if it ran, else ours."""
    ok = {r["name"] for r in record["rows"] if "error" not in r}
    return "baseline" if "baseline" in ok else "batchserve"


def summary_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per contender: its figures and ratios (what :func:`table` shows).

    Keys: ``contender``, ``how`` (or why it did not run, with the whole message in
    ``error``), then the batch
    shape's ``texts_per_s``, ``vs_yardstick``, ``vs_batchserve``, ``request_p50_ms``,
    ``request_p99_ms``; one text per request past saturation: ``offered_per_s``,
    ``goodput_per_s``, ``vs_reference`` (see :func:`reference`), ``p50_ms``, ``p99_ms``;
    at half capacity: ``half_offered_per_s``, ``half_p50_ms``, ``half_p99_ms``.
    """
    rows = {r["name"]: r for r in record["rows"]}
    yard = _figure(rows.get("yardstick"), "batch", "texts_per_s")
    ours = _figure(rows.get("batchserve"), "batch", "texts_per_s")
    ref_good = _figure(rows.get(reference(record)), "saturated", "ok_per_s")
    out = []
    for r in record["rows"]:
        if "error" in r:
            first = r["error"].splitlines()[0][:120]
            out.append(
                {"contender": r["name"], "how": f"did not run: {first}", "error": r["error"]}
            )
            continue
        tps = _figure(r, "batch", "texts_per_s")
        good = _figure(r, "saturated", "ok_per_s")
        out.append(
            {
                "contender": r["name"],
                "how": _how(r),
                "texts_per_s": tps,
                "vs_yardstick": _ratio(tps, yard),
                "vs_batchserve": _ratio(tps, ours),
                "request_p50_ms": _figure(r, "batch", "p50_ms"),
                "request_p99_ms": _figure(r, "batch", "p99_ms"),
                "offered_per_s": _figure(r, "saturated", "offered_per_s"),
                "goodput_per_s": good,
                "vs_reference": _ratio(good, ref_good),
                "p50_ms": _figure(r, "saturated", "p50_ms"),
                "p99_ms": _figure(r, "saturated", "p99_ms"),
                "half_offered_per_s": _figure(r, "half", "offered_per_s"),
                "half_p50_ms": _figure(r, "half", "p50_ms"),
                "half_p99_ms": _figure(r, "half", "p99_ms"),
            }
        )
    return out


def _num(v: Any, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


def table(record: dict[str, Any]) -> str:
    """The scenario's figures and ratios as a Markdown table, and what they mean."""
    plan, texts = record["plan"], record["texts"]
    half = (
        f"{plan['half_rate']:g}/s for all"
        if plan.get("half_rate")
        else "half the goodput measured there"
    )
    lines = [
        f"{texts['count']} paragraphs of Python's reference manual (words: mean "
        f"{texts['words_mean']}, median {texts['words_median']}, p90 {texts['words_p90']}), "
        f"shuffled. Batch shape: {plan['per_request']} texts per request, closed loop on "
        f"{plan['connections']} kept-alive connections, {plan['seconds']:g} s. One text per "
        f"request: open loop, Poisson, {DEADLINE_MS / 1e3:g} s deadline, {plan['seconds']:g} s "
        f"each, past saturation ({plan['overload']:g}x the contender's batch-shape texts/s "
        f"offered) and at {half}. The yardstick: SentenceTransformer.encode on each "
        "request's texts, one padded batch, torch float32; start: seconds until a server "
        "first answered (batchserve's first start with --backend auto measures its engines).",
        "",
        "| contender | how it ran | batch shape texts/s | vs yardstick | vs batchserve "
        "| request p50 / p99 ms | one text: offered /s | goodput /s "
        f"| vs {reference(record)} | p50 / p99 ms | half capacity: offered /s | p50 / p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary_rows(record):
        if "error" in r:
            lines.append(f"| {r['contender']} | {r['how']} |" + " |" * 10)
            continue
        lines.append(
            f"| {r['contender']} | {r['how']} | {_num(r['texts_per_s'])} "
            f"| {_x(r['vs_yardstick'])} | {_x(r['vs_batchserve'])} "
            f"| {_num(r['request_p50_ms'], '.0f')} / {_num(r['request_p99_ms'], '.0f')} "
            f"| {_num(r['offered_per_s'])} | {_num(r['goodput_per_s'])} "
            f"| {_x(r['vs_reference'])} "
            f"| {_num(r['p50_ms'], '.0f')} / {_num(r['p99_ms'], '.0f')} "
            f"| {_num(r['half_offered_per_s'])} "
            f"| {_num(r['half_p50_ms'], '.0f')} / {_num(r['half_p99_ms'], '.0f')} |"
        )
    sweeps = [
        f"{r['name']}: " + ", ".join(f"{b}: {v}" for b, v in r["sweep"].items())
        for r in record["rows"]
        if r.get("sweep")
    ]
    if sweeps:
        lines += ["", "Batch shape texts/s by setting: " + "; ".join(sweeps) + "."]
    return "\n".join(lines)
