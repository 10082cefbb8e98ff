"""The served embedding pass beside the machine's matrix-product rate; one text a request vs 32.

Two questions about the built-in model (all-MiniLM-L6-v2), answered side by side in one
run: how much of the machine's arithmetic does a served pass put to use, and how does one
text a request (how queries arrive) compare with 32 (how an indexer sends them)?

**Texts**: the paragraphs of Python's reference manual
(:func:`batchserve.loadgen.texts.reference_paragraphs`), shuffled with seed 0: the
sequence the comparison's ``real`` scenario sends (``bench/peers/compare.py --scenarios
real``), from its start.

**Servers**, one after the other (``--servers``): ``auto``, ``batchserve serve`` with no
engine flag, as ``scripts/serve`` runs it (the engine its verdict picked), and ``torch``,
pinned to ``--backend torch --dtype float32``. Each is started, warmed (``--warmup``
seconds of each shape, not counted), then sent two closed loops
(:func:`batchserve_testing.closed_loop.embeddings`: kept-alive connections, each sending
its next request when its last is answered), alternated over ``--rounds``, each for
``--seconds``:

* **A**, the batch shape: ``--per-request`` texts (32) a request on
  ``--batch-connections`` connections (2);
* **B**, the query shape: one text a request on ``--query-connections`` connections (32).

Per run: texts/s, a request's p50 and p99, and from the server's own ``/status`` (read
before and after) what its passes computed: **real tokens a second** (the texts' own
tokens, special ones included), tokens computed over real (padding's waste), sub-passes a
pass. **Useful GFLOP/s** is real tokens a second times the model's linear-layer FLOPs a
token, ``2 x layers x (4 d^2 + 2 d f)`` from its ``config.json``
(:class:`batchserve_testing.arithmetic.Shape`; 21.2 MFLOP for MiniLM-L6: attention's own
products, layer norms and pooling are not counted). The client's CPU (this process, read
from ``/proc``), the server's, and the rest of the machine's (every other process: a
neighbour that took cores from the run) are printed as cores: on a small machine the
client's share is taken from the server.

**The machine's rate**: torch's matrix product at the model's shapes (2048 tokens x d @ d x
f: 2048x384 @ 384x1536), float32 and bfloat16, the best of ``--matmul-seconds`` of repeats
(:func:`batchserve_testing.arithmetic.matmul_rate`), in this process on as many threads as
the server's passes use together (workers x threads a pass, as ``/status`` reports them),
measured before the first server starts and again after the last stops; both are printed,
and the shares are taken against the better of the two.

The table has a row per server and shape: the engine (backend/precision from ``/status``),
the medians over the rounds, the useful GFLOP/s as a share of the float32 and of the
bfloat16 rate, and B/A, the query shape's texts/s over the batch shape's. ``--json``
prints the rows as JSON objects, one a line, for ``bench/tools/record.py``.

Run: ``python bench/models/arithmetic_rate.py [--seconds 20] [--rounds 2] [--json]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from batchserve_testing import closed_loop
from batchserve_testing.arithmetic import Shape, matmul_rate
from batchserve_testing.bench import batchserve, cpu_s
from batchserve_testing.process import machine_cpu_s

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.embeddings import builtin_path
from batchserve.engines.runtime import default_threads, default_workers
from batchserve.loadgen.texts import reference_paragraphs

MODEL = "all-MiniLM-L6-v2"
#: The servers, by name: their engine flags.
SERVERS = {"auto": [], "torch": ["--backend", "torch", "--dtype", "float32"]}
#: The matrix product's precisions, in the order they are measured.
DTYPES = ("float32", "bfloat16")
#: The rows of the product (a pass's tokens).
MATMUL_TOKENS = 2048


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One closed loop against one server, with what the server's passes computed meanwhile.

    Attributes:
        texts_per_s: texts answered over the wall time.
        p50_ms: a request's median latency.
        p99_ms: its 99th percentile.
        real_tokens_per_s: the passes' real tokens over the wall time.
        computed_per_real: tokens computed (padding included) over real tokens.
        subpasses_per_pass: sub-passes over passes.
        mean_pass_texts: texts over passes.
        client_cores: this process's CPU seconds over the wall time.
        server_cores: the server's CPU seconds over the wall time.
        others_cores: the rest of the machine's busy CPU seconds over the wall time (other
            processes: a neighbour's share of the cores, which the run did not get).
    """

    texts_per_s: float
    p50_ms: float
    p99_ms: float
    real_tokens_per_s: float
    computed_per_real: float
    subpasses_per_pass: float
    mean_pass_texts: float
    client_cores: float
    server_cores: float
    others_cores: float


def status(port: int) -> dict[str, Any]:
    """The built-in model's entry of the server's ``/status``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/status")
        model: dict[str, Any] = json.loads(conn.getresponse().read())["models"][MODEL]
    finally:
        conn.close()
    return model


def measure(
    url: str, port: int, pid: int, requests: list[list[str]], connections: int, seconds: float
) -> Run:
    """One closed loop (see the module docstring) and the server's counters around it."""
    before = status(port)["passes"]
    cpu0, machine0 = cpu_s(pid), machine_cpu_s()
    loop = closed_loop.embeddings(url, MODEL, requests, connections=connections, seconds=seconds)
    server_s, machine_s = cpu_s(pid) - cpu0, machine_cpu_s() - machine0
    after = status(port)["passes"]
    delta = {k: after[k] - before[k] for k in ("passes", "subpasses", "real_tokens")}
    computed = after["computed_tokens"] - before["computed_tokens"]
    return Run(
        texts_per_s=loop.texts_per_s,
        p50_ms=1e3 * loop.quantile_s(0.5),
        p99_ms=1e3 * loop.quantile_s(0.99),
        real_tokens_per_s=delta["real_tokens"] / loop.wall_s,
        computed_per_real=computed / delta["real_tokens"] if delta["real_tokens"] else 1.0,
        subpasses_per_pass=delta["subpasses"] / delta["passes"] if delta["passes"] else 0.0,
        mean_pass_texts=loop.texts / delta["passes"] if delta["passes"] else 0.0,
        client_cores=loop.client_cores,
        server_cores=server_s / loop.wall_s,
        others_cores=max(0.0, machine_s - server_s - loop.client_cpu_s) / loop.wall_s,
    )


def rates(shape: Shape, threads: int, seconds: float) -> dict[str, float]:
    """The matrix product's GFLOP/s at ``threads`` threads, per precision."""
    return {dtype: matmul_rate(shape, threads, dtype=dtype, seconds=seconds) for dtype in DTYPES}


def median_run(runs: list[Run]) -> dict[str, float]:
    """Each figure's median over the rounds."""
    rows = [asdict(r) for r in runs]
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopPlan:
    """One of the two closed loops.

    Attributes:
        key: ``A`` (the batch shape) or ``B`` (the query shape).
        label: the shape in words.
        requests: the requests' texts, sent round and round.
        connections: kept-alive connections.
    """

    key: str
    label: str
    requests: list[list[str]]
    connections: int

    @property
    def per_request(self) -> int:
        """Texts a request (the first request's)."""
        return len(self.requests[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """One server's runs.

    Attributes:
        name: the server (a key of :data:`SERVERS`).
        engine: ``backend/precision`` as its ``/status`` reports them.
        precision: the engine's precision alone.
        threads: its passes' threads together (workers x threads a pass).
        start_s: from the command to its ready line.
        runs: each loop's runs, by the loop's key, in round order.
    """

    name: str
    engine: str
    precision: str
    threads: int
    start_s: float
    runs: dict[str, list[Run]]


def serve(
    name: str, loops: list[LoopPlan], args: argparse.Namespace, say: Callable[[str], None]
) -> Served:
    """Start one server, warm it, run the loops alternately for the rounds, stop it."""
    t0 = time.perf_counter()
    with batchserve(SERVERS[name]) as served:
        start_s = time.perf_counter() - t0
        entry = status(served.port)
        engine = entry["engine"] or {}
        workers, threads = int(entry["settings"]["workers"]), int(engine.get("threads") or 1)
        precision = str(engine.get("precision"))
        label = f"{engine.get('backend')}/{precision}"
        say(f"[{name}] {label}, {workers} worker(s) x {threads} thread(s), up in {start_s:.1f} s")
        for loop in loops:  # the sub-pass cost is learned here too
            closed_loop.embeddings(
                served.url, MODEL, loop.requests, connections=loop.connections, seconds=args.warmup
            )
        runs: dict[str, list[Run]] = {loop.key: [] for loop in loops}
        for r in range(args.rounds):
            for loop in loops:
                run = measure(
                    served.url,
                    served.port,
                    served.proc.pid,
                    loop.requests,
                    loop.connections,
                    args.seconds,
                )
                runs[loop.key].append(run)
                say(
                    f"[{name}] round {r + 1} {loop.key} ({loop.label}): "
                    f"{run.texts_per_s:.1f} texts/s, p50 {run.p50_ms:.0f} ms, "
                    f"p99 {run.p99_ms:.0f} ms, {run.real_tokens_per_s:.0f} tokens/s, "
                    f"CPU client {run.client_cores:.2f}, server {run.server_cores:.2f}, "
                    f"others {run.others_cores:.2f} cores"
                )
    return Served(
        name=name,
        engine=label,
        precision=precision,
        threads=workers * threads,
        start_s=start_s,
        runs=runs,
    )


def rows_of(
    served: Served, loops: list[LoopPlan], model: Shape, matmul: dict[str, float], seconds: float
) -> list[dict[str, Any]]:
    """The table's rows for one server: a row per loop, medians over the rounds."""
    medians = {loop.key: median_run(served.runs[loop.key]) for loop in loops}
    b_over_a = medians["B"]["texts_per_s"] / medians["A"]["texts_per_s"]
    # The rate at the engine's own precision: float32 for a float32 engine, else bfloat16
    # (the fastest product measured; what a bfloat16 or int8 engine is held against).
    own = "float32" if served.precision == "float32" else "bfloat16"
    rows = []
    for loop in loops:
        m = medians[loop.key]
        gflops = m["real_tokens_per_s"] * model.flops_per_token / 1e9
        rows.append(
            {
                "server": served.name,
                "engine": served.engine,
                "loop": loop.key,
                "shape": loop.label,
                "per_request": loop.per_request,
                "connections": loop.connections,
                "rounds": len(served.runs[loop.key]),
                "seconds": seconds,
                "texts_per_s": round(m["texts_per_s"], 1),
                "p50_ms": round(m["p50_ms"], 1),
                "p99_ms": round(m["p99_ms"], 1),
                "real_tokens_per_s": round(m["real_tokens_per_s"]),
                "mflop_per_token": round(model.flops_per_token / 1e6, 2),
                "useful_gflops": round(gflops, 1),
                "threads": served.threads,
                "matmul_fp32_gflops": round(matmul["float32"], 1),
                "matmul_bf16_gflops": round(matmul["bfloat16"], 1),
                "share_of_fp32": round(gflops / matmul["float32"], 3),
                "share_of_bf16": round(gflops / matmul["bfloat16"], 3),
                "own_precision": own,
                "share_of_own": round(gflops / matmul[own], 3),
                "computed_per_real": round(m["computed_per_real"], 3),
                "subpasses_per_pass": round(m["subpasses_per_pass"], 2),
                "mean_pass_texts": round(m["mean_pass_texts"], 1),
                "client_cores": round(m["client_cores"], 2),
                "server_cores": round(m["server_cores"], 2),
                "others_cores": round(m["others_cores"], 2),
                "b_over_a": round(b_over_a, 3),
                "start_s": round(served.start_s, 1),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], per_request: int) -> None:
    """The rows as a table on stdout."""
    print(
        f"{'engine':17} {'shape':19} {'texts/s':>7} {'p50 ms':>6} {'p99 ms':>6} "
        f"{'tokens/s':>8} {'GFLOP/s':>7} {'of fp32':>7} {'of bf16':>7} {'comp/real':>9} "
        f"{'sub/pass':>8} {'texts/pass':>10} {'client':>6} {'server':>6} {'others':>6} {'B/A':>5}"
    )
    for row in rows:
        print(
            f"{row['engine']:17} {row['shape']:19} {row['texts_per_s']:7.1f} "
            f"{row['p50_ms']:6.0f} {row['p99_ms']:6.0f} {row['real_tokens_per_s']:8d} "
            f"{row['useful_gflops']:7.1f} {row['share_of_fp32'] * 100:6.1f}% "
            f"{row['share_of_bf16'] * 100:6.1f}% {row['computed_per_real']:9.3f} "
            f"{row['subpasses_per_pass']:8.2f} {row['mean_pass_texts']:10.1f} "
            f"{row['client_cores']:6.2f} {row['server_cores']:6.2f} {row['others_cores']:6.2f} "
            + (f"{row['b_over_a']:5.2f}" if row["loop"] == "B" else "")
        )
    print(
        "client, server, others: CPU in cores over the run (others: the rest of the "
        "machine); comp/real: tokens computed over real; "
        f"B/A: one text a request's texts/s over {per_request} a request's; the shares "
        "against the better matmul of before and after (a float32 engine's own: of fp32; "
        "any other's: of bf16)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="each measured run")
    parser.add_argument("--rounds", type=int, default=2, help="A then B, this many times")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of each shape")
    parser.add_argument("--per-request", type=int, default=32, help="texts a request in A")
    parser.add_argument("--batch-connections", type=int, default=2, help="connections in A")
    parser.add_argument("--query-connections", type=int, default=32, help="connections in B")
    parser.add_argument(
        "--matmul-seconds", type=float, default=2.0, help="repeats of each matrix product"
    )
    parser.add_argument(
        "--servers", default="auto,torch", help="which of auto, torch (comma-separated)"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    args = parser.parse_args()
    names = [n for n in args.servers.split(",") if n]
    if args.rounds < 1 or args.seconds <= 0:
        parser.error(f"--rounds must be >= 1 and --seconds > 0, got {args.rounds}, {args.seconds}")
    if not names or set(names) - set(SERVERS):
        parser.error(f"--servers: a comma-separated list of {', '.join(SERVERS)}")

    def say(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    texts = list(reference_paragraphs())
    random.Random(0).shuffle(texts)
    n = args.per_request
    loops = [
        LoopPlan(
            key="A",
            label=f"{n} a request, {args.batch_connections} conn",
            requests=[texts[i : i + n] for i in range(0, len(texts), n)],
            connections=args.batch_connections,
        ),
        LoopPlan(
            key="B",
            label=f"1 a request, {args.query_connections} conn",
            requests=[[t] for t in texts],
            connections=args.query_connections,
        ),
    ]
    model = Shape.of(builtin_path())
    say(
        f"texts: {len(texts)} paragraphs of Python's reference manual, shuffled (seed 0), "
        f"{statistics.mean(len(t.split()) for t in texts):.1f} words mean"
    )
    say(
        f"FLOP a real token: {model.describe()} (the linear layers only; attention's "
        "QK^T and AV, layer norms and pooling not counted)"
    )
    # The threads the servers' passes will use together, as a server computes them; a
    # server whose /status says otherwise gets its own product measured after the runs.
    threads = default_threads()
    expected = default_workers("cpu", threads) * threads
    before = {expected: rates(model, expected, args.matmul_seconds)}
    results = [serve(name, loops, args, say) for name in names]
    after = {
        total: rates(model, total, args.matmul_seconds)
        for total in sorted({r.threads for r in results} | {expected})
    }
    for total, got in after.items():
        was = before.get(total)
        say(
            f"matmul {MATMUL_TOKENS}x{model.width} @ {model.width}x{model.ffn}, torch, "
            f"{total} thread(s), GFLOP/s before / after the servers: "
            + ", ".join(
                f"{dtype} {was[dtype] if was else float('nan'):.1f} / {got[dtype]:.1f}"
                for dtype in DTYPES
            )
        )
    rows = []
    for served in results:
        was = before.get(served.threads, {})
        best = {d: max(after[served.threads][d], was.get(d, 0.0)) for d in DTYPES}
        rows += rows_of(served, loops, model, best, args.seconds)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print_table(rows, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
