"""The seed's scenario, by any carrier and any client: one script, the variants as flags.

The Go seed's experiment: a synthetic model of 8 ms per call + 0.25 ms per item, 600
requests/s offered open loop, a 250 ms deadline, a queue of 64, batches of at most 32 closed
after 2 ms. Each contender is one way of running it, named ``client/via/server``:

* ``--via``: how requests reach the batcher: ``inprocess`` (a Batcher in this process, as
  ``batchserve demo`` runs it: no server), ``http`` (``batchserve serve``, OpenAI's
  ``POST /v1/embeddings``, or KServe's with ``--api kserve``) or ``grpc`` (KServe's
  ``ModelInfer`` on the same server);
* ``--client``: who sends them: ``batchserve`` (the project's own open-loop generator,
  :func:`batchserve.loadgen.run_load`, as ``batchserve load``; in process,
  :func:`~batchserve.loadgen.inprocess.run_open_loop`), ``aiohttp`` (an ordinary asyncio
  client, one event loop, a request every ``1 / --rate`` s from a fixed schedule: a figure
  that holds only under our own generator proves less), ``perf_analyzer`` (Triton's C++
  client, ``--async --request-rate-range R --request-distribution poisson``; it stops at
  the first failed request, and such a run is reported as stopped) or ``go`` (the Go seed
  itself, built from ``--shared``'s seed file with a Go toolchain; its rows are printed
  beside ``batchserve demo``'s, as it runs its own configurations);
* ``--server``: ``batchserve`` or ``mosec`` (its venv from ``bench/peers/setup.py --peers
  mosec``; HTTP only), with the same batching settings.

Every combination that makes sense runs; the others are named and skipped. Each round
runs every contender once, in an order that rotates per round, all sending the same
schedule; latency runs from each request's scheduled send time, so a late sender or a slow
server cannot hide a queue. Per contender, the median over rounds of goodput, p50 and p99
of the successes, the server's own p99 where it says (``Server-Timing``: from its first
byte read to its answer), refusals and timeouts, and the sender's own lag (past a few ms,
the figure is the sender's, not the server's); then each contender's p99 over the first
contender's. ``--json`` prints one object per contender instead (for ``bench/tools/
record.py``). Prints figures and ratios; not a test. On a shared 2-core machine client,
server and model share the cores: compare within one run.

Run: ``python bench/scenarios/seed.py [--via inprocess,http,grpc]
[--client batchserve,aiohttp,perf_analyzer,go] [--server batchserve,mosec] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import math
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from batchserve.config import BatchConfig
from batchserve.loadgen import LoadConfig, LoadRun, run_load
from batchserve.loadgen.inprocess import run_open_loop
from batchserve.models.synthetic import SyntheticModel
from batchserve.workload.arrivals import arrival_times
from batchserve.workload.summary import percentile
from batchserve_testing.bench import BENCH, ROOT, batchserve, serving
from batchserve_testing.process import free_port
from batchserve_testing.tools import find_perf_analyzer

VIAS = ("inprocess", "http", "grpc")
CLIENTS = ("batchserve", "aiohttp", "perf_analyzer", "go")
SERVERS = ("batchserve", "mosec")
#: The model's name on each server (Mosec's script serves the peers' name).
MODEL = {"batchserve": "seed", "mosec": "bench"}
#: The generator's own send lag (p99) past which a run measured the generator.
LAG_MS = 5.0
#: The one text perf_analyzer sends in every request (its ``--string-data``).
PA_TEXT = "the quick brown fox jumps over the lazy dog"
NAN = math.nan

Row = dict[str, Any]


def server_flags(args: argparse.Namespace) -> list[str]:
    """``batchserve serve``'s flags for the scenario, HTTP and gRPC on free ports."""
    spec = f"synthetic:fixed={args.fixed_ms:g}ms,per_item={args.per_item_ms:g}ms,dim=8"
    return [
        "--model", f"seed={spec}",
        "--max-batch-size", str(args.max_batch_size),
        "--max-wait", f"{args.max_wait_ms:g}ms",
        "--queue-size", str(args.queue_size),
        "--timeout", f"{args.deadline * 1e3:g}ms",
        "--grpc-port", "0",
    ]  # fmt: skip


@contextlib.contextmanager
def mosec(args: argparse.Namespace) -> Iterator[str]:
    """Mosec on the scenario's model and batching settings until the block ends; its URL."""
    python = BENCH / ".venvs" / "mosec" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: run python bench/peers/setup.py --peers mosec")
    port = free_port()
    argv = [
        str(python), str(BENCH / "peers" / "mosec_server.py"), "--port", str(port),
        "--model", "sleep", "--fixed-ms", f"{args.fixed_ms:g}",
        "--per-item-ms", f"{args.per_item_ms:g}", "--max-batch", str(args.max_batch_size),
        "--max-wait-ms", f"{args.max_wait_ms:g}", "--queue-size", str(args.queue_size),
    ]  # fmt: skip
    with serving(argv, port, ready_s=120):
        yield f"http://127.0.0.1:{port}"


# -- the clients ------------------------------------------------------------------------------


def inprocess(args: argparse.Namespace) -> Row:
    """A Batcher in this process on the schedule, as ``batchserve demo`` runs it."""
    config = BatchConfig(
        max_batch_size=args.max_batch_size,
        max_wait_s=args.max_wait_ms / 1e3,
        queue_size=args.queue_size,
    )
    s = asyncio.run(
        run_open_loop(
            name="in-process",
            model=SyntheticModel(args.fixed_ms / 1e3, args.per_item_ms / 1e3),
            config=config,
            schedule=arrival_times(rate=args.rate, duration_s=args.duration),
            timeout_s=args.deadline,
            duration_s=args.duration,
        )
    )
    return _row(s.ok_per_s, s.p50_ms, s.p99_ms, NAN, s.rejected, s.timed_out, s.errors, 0.0)


def generator(url: str, api: str, model: str, args: argparse.Namespace, seconds: float) -> Row:
    """The project's open-loop generator (``batchserve load``) at the scenario's rate."""
    run = run_load(
        LoadConfig(
            url=url,
            api=api,
            model=model,
            rate=args.rate,
            duration_s=seconds,
            timeout_s=args.deadline,
        )
    )
    s = run.report.summary
    own = _server_p99_ms(run)
    return _row(
        s.ok_per_s,
        s.p50_ms,
        s.p99_ms,
        own,
        s.rejected,
        s.timed_out,
        s.errors,
        run.report.lag_p99_ms,
    )


def _server_p99_ms(run: LoadRun) -> float:
    records = run.records
    ok = [t for t, st in zip(records.server_s, records.status, strict=True) if st == 200]
    ok = [t for t in ok if not math.isnan(t)]
    return 1e3 * percentile(sorted(ok), 0.99) if ok else NAN


async def _aiohttp(url: str, model: str, rate: float, seconds: float, deadline_s: float) -> Row:
    import aiohttp

    latencies: list[float] = []
    own: list[float] = []
    endings: dict[str, int] = {}
    body = {"model": model, "input": "hello world"}
    timeout = aiohttp.ClientTimeout(total=deadline_s)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:

        async def one(at: float) -> None:
            try:
                async with session.post(f"{url}/v1/embeddings", json=body) as resp:
                    await resp.read()
                    status, timing = resp.status, resp.headers.get("Server-Timing", "")
            except TimeoutError:
                endings["gave up"] = endings.get("gave up", 0) + 1
                return
            except aiohttp.ClientError as exc:
                endings[type(exc).__name__] = endings.get(type(exc).__name__, 0) + 1
                return
            took = time.monotonic() - at
            if status == 200 and took <= deadline_s:
                latencies.append(took)
                if timing.startswith("total;dur="):  # batchserve's own account of it
                    own.append(float(timing[len("total;dur=") :]) / 1e3)
            else:
                key = str(status) if status != 200 else "late 200"
                endings[key] = endings.get(key, 0) + 1

        tasks = []
        lags: list[float] = []
        n = int(rate * seconds)
        t0 = time.monotonic() + 0.1
        for i in range(n):
            at = t0 + i / rate
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(time.monotonic() - at)
            tasks.append(asyncio.ensure_future(one(at)))
        await asyncio.gather(*tasks)
    latencies.sort()
    own.sort()
    lags.sort()
    refused = sum(v for k, v in endings.items() if k in ("429", "503"))
    late = endings.get("gave up", 0) + endings.get("late 200", 0) + endings.get("504", 0)
    return _row(
        len(latencies) / seconds,
        1e3 * percentile(latencies, 0.5) if latencies else NAN,
        1e3 * percentile(latencies, 0.99) if latencies else NAN,
        1e3 * percentile(own, 0.99) if own else NAN,
        refused,
        late,
        n - len(latencies) - refused - late,
        1e3 * percentile(lags, 0.99),
    )


def aiohttp_client(url: str, model: str, args: argparse.Namespace, seconds: float) -> Row:
    """An ordinary asyncio client: aiohttp, one event loop, its pool with no limit."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise SystemExit("--client aiohttp needs aiohttp: .venv/bin/pip install aiohttp") from None
    return asyncio.run(_aiohttp(url, model, args.rate, seconds, args.deadline))


def perf_analyzer(address: str, protocol: str, args: argparse.Namespace, window_ms: int) -> Row:
    """One perf_analyzer run at the rate (Poisson, async): its figures, or why it stopped."""
    binary, env = find_perf_analyzer()
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "pa.csv"
        cmd = [
            binary, "-m", "seed", "-u", address, "-i", protocol, "--async",
            "--request-rate-range", f"{args.rate:g}", "--request-distribution", "poisson",
            "-p", str(window_ms), "-r", "3", "-s", "1000", "--percentile=99",
            "--string-data", PA_TEXT, "-f", str(out),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        text = done.stdout + done.stderr
        if done.returncode != 0 or not out.exists():
            errors = [line.strip() for line in text.splitlines() if "error" in line.lower()]
            return {"stopped": errors[0] if errors else text[-300:]}
        row = next(csv.DictReader(out.open()))
    delayed = re.search(r"([\d.]+)% of the requests were delayed", text)
    server = re.search(r"Avg request latency: (\d+) usec", text)
    figures = _row(
        float(row["Inferences/Second"]),
        float(row["p50 latency"]) / 1e3,
        float(row["p99 latency"]) / 1e3,
        NAN,
        0,
        0,
        0,
        NAN,
    )
    figures["delayed_pct"] = float(delayed.group(1)) if delayed else 0.0
    figures["server_mean_ms"] = float(server.group(1)) / 1e3 if server else NAN
    return figures


def _row(
    ok_per_s: float,
    p50_ms: float,
    p99_ms: float,
    server_p99_ms: float,
    rejected: int,
    timed_out: int,
    errors: int,
    lag_p99_ms: float,
) -> Row:
    return {
        "ok_per_s": ok_per_s,
        "p50_ms": p50_ms,
        "p99_ms": p99_ms,
        "server_p99_ms": server_p99_ms,
        "rejected": rejected,
        "timed_out": timed_out,
        "errors": errors,
        "lag_p99_ms": lag_p99_ms,
    }


# -- the Go seed --------------------------------------------------------------------------------

GO_ROW = re.compile(
    r"^(?P<name>.{26}) +(?P<ok>\d+) ok/s +batch +(?P<batch>[\d.]+) +p50 +(?P<p50>[\d.]+) ms"
    r" +p99 +(?P<p99>[\d.]+) ms +rejected +(?P<rej>\d+) +timed out +(?P<to>\d+)"
)
GO_FIELDS = ("ok_per_s", "avg_batch", "p50_ms", "p99_ms", "rejected", "timed_out")


def go_seed(shared: pathlib.Path) -> list[Row]:
    """Build and run the Go seed from ``shared``'s seed file; its rows."""
    seed = next(shared.glob("seeds/000_*.txt"))
    text = seed.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        (pathlib.Path(tmp) / "main.go").write_text(text[text.index("// batcher.go") :])
        subprocess.run(["go", "build", "-o", "seed", "main.go"], cwd=tmp, check=True)
        out = subprocess.run(
            [str(pathlib.Path(tmp) / "seed")], capture_output=True, text=True, check=True
        ).stdout
    rows: list[Row] = []
    for line in out.splitlines():
        if m := GO_ROW.match(line):
            values = (m["ok"], m["batch"], m["p50"], m["p99"], m["rej"], m["to"])
            rows.append(
                {"name": m["name"].strip(), **dict(zip(GO_FIELDS, map(float, values), strict=True))}
            )
    return rows


def demo() -> list[Row]:
    """``batchserve demo --json``'s rows: the seed's configurations, in process."""
    out = subprocess.run(
        [sys.executable, "-m", "batchserve", "demo", "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def go_beside_demo(args: argparse.Namespace) -> None:
    """The Go seed and ``batchserve demo``, interleaved ``--rounds`` times; medians, ratios."""
    if shutil.which("go") is None:
        print("go: no Go toolchain here (apt-get install golang-go); skipped")
        return
    runs: dict[str, list[list[Row]]] = {"Go seed": [], "batchserve demo": []}
    for _ in range(args.rounds):
        runs["Go seed"].append(go_seed(args.shared))
        runs["batchserve demo"].append(demo())
    medians: dict[str, list[Row]] = {}
    for side, got in runs.items():
        medians[side] = [
            {"name": first["name"]}
            | {f: statistics.median(float(r[i][f]) for r in got) for f in GO_FIELDS}
            for i, first in enumerate(got[0])
        ]
        print(f"\n{side}, median of {args.rounds} runs:")
        for row in medians[side]:
            print(
                f"  {row['name']!s:<26} {row['ok_per_s']:5.0f} ok/s  batch "
                f"{row['avg_batch']:4.1f}  p50 {row['p50_ms']:5.1f} ms  p99 "
                f"{row['p99_ms']:6.1f} ms  rejected {row['rejected']:4.0f}  timed out "
                f"{row['timed_out']:4.0f}"
            )
    print("\nbatchserve demo / Go seed, same row (ok/s, p99):")
    for g, d in zip(medians["Go seed"], medians["batchserve demo"], strict=False):
        ok = float(d["ok_per_s"]) / max(float(g["ok_per_s"]), 1e-9)
        p99 = float(d["p99_ms"]) / max(float(g["p99_ms"]), 1e-9)
        print(f"  {g['name']!s:<26} ok/s x{ok:5.2f}   p99 x{p99:5.2f}")


# -- the run ------------------------------------------------------------------------------------


def contenders(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The ``client/via/server`` names to run, and why each other combination is not run."""
    run: list[str] = []
    skipped: list[str] = []
    for client in args.client:
        if client == "go":
            continue
        for via in args.via:
            for server in args.server:
                name = f"{client}/{via}/{server}"
                why = None
                if via == "inprocess":
                    if client != "batchserve" or server != "batchserve":
                        why = "in process, only batchserve's own batcher and generator"
                elif server == "mosec" and via != "http":
                    why = "Mosec serves HTTP only"
                elif server == "mosec" and client == "perf_analyzer":
                    why = "Mosec speaks no KServe"
                elif client == "aiohttp" and via != "http":
                    why = "aiohttp sends HTTP only"
                if why is None and via == "http" and client == "batchserve":
                    apis = args.api if server == "batchserve" else ["openai"]
                    run.extend(f"{name}:{api}" for api in apis)
                elif why is None:
                    run.append(name)
                else:
                    skipped.append(f"{name} ({why})")
    return run, skipped


def measure(
    name: str, where: dict[str, str], args: argparse.Namespace, seconds: float, window_ms: int
) -> Row:
    """One run of contender ``name`` against the servers at ``where``."""
    contender, _, api = name.partition(":")
    client, via, server = contender.split("/")
    if via == "inprocess":
        return inprocess(args)
    model = MODEL[server]
    if client == "batchserve":
        url = where[f"{server}/{via}"]
        return generator(url, "kserve" if via == "grpc" else api, model, args, seconds)
    if client == "aiohttp":
        return aiohttp_client(where[f"{server}/http"], model, args, seconds)
    address = where[f"{server}/{via}"].split("://", 1)[1]
    return perf_analyzer(address, via, args, window_ms)


def main() -> int:
    def names(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
        def parse(value: str) -> list[str]:
            got = [v.strip() for v in value.split(",") if v.strip()]
            bad = [v for v in got if v not in choices]
            if bad or not got:
                raise argparse.ArgumentTypeError(f"each of {', '.join(choices)}; got {value!r}")
            return got

        return parse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--via", type=names(VIAS), default=list(VIAS), help=",".join(VIAS))
    parser.add_argument(
        "--client", type=names(CLIENTS), default=["batchserve"], help=",".join(CLIENTS)
    )
    parser.add_argument(
        "--server", type=names(SERVERS), default=["batchserve"], help=",".join(SERVERS)
    )
    parser.add_argument(
        "--api",
        type=names(("openai", "kserve")),
        default=["openai"],
        help="the HTTP APIs batchserve's generator sends (openai,kserve)",
    )
    parser.add_argument("--rate", type=float, default=600.0, help="requests/s offered")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=0.25, help="seconds")
    parser.add_argument("--fixed-ms", type=float, default=8.0, help="the model's cost per pass")
    parser.add_argument("--per-item-ms", type=float, default=0.25, help="and per item")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--queue-size", type=int, default=64)
    parser.add_argument(
        "--pa-window", type=int, default=3000, help="perf_analyzer's measurement window, ms"
    )
    parser.add_argument(
        "--shared", type=pathlib.Path, default=ROOT.parent / "shared", help="the Go seed's home"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per contender")
    args = parser.parse_args()

    names_run, skipped = contenders(args)
    for s in skipped:
        print(f"skipped: {s}", file=sys.stderr)
    if not args.json:
        print(
            f"seed scenario: model {args.fixed_ms:g} ms + {args.per_item_ms:g} ms/item, "
            f"{args.rate:g} requests/s open loop for {args.duration:g} s, deadline "
            f"{args.deadline * 1e3:g} ms, batch <= {args.max_batch_size}, wait "
            f"{args.max_wait_ms:g} ms, queue {args.queue_size}; {args.rounds} rounds"
        )
    rows: dict[str, list[Row]] = {n: [] for n in names_run}
    stopped: dict[str, list[str]] = {n: [] for n in names_run}
    servers_needed = {n.split(":")[0].split("/")[2] for n in names_run if "/inprocess/" not in n}
    with contextlib.ExitStack() as stack:
        where: dict[str, str] = {}
        if "batchserve" in servers_needed:
            served = stack.enter_context(batchserve(server_flags(args)))
            where["batchserve/http"] = served.url
            where["batchserve/grpc"] = f"grpc://{served.grpc}"
        if "mosec" in servers_needed:
            where["mosec/http"] = stack.enter_context(mosec(args))
        for name in names_run:  # warm-up: the cost model measures the model, connections open
            measure(name, where, args, 1.0, 1000)
        for r in range(args.rounds):
            k = r % max(1, len(names_run))
            for name in names_run[k:] + names_run[:k]:
                got = measure(name, where, args, args.duration, args.pa_window)
                if "stopped" in got:
                    stopped[name].append(got["stopped"])
                    print(f"round {r + 1} {name}: stopped: {got['stopped']}", file=sys.stderr)
                    continue
                rows[name].append(got)
                if not args.json:
                    print(f"round {r + 1} {name:<34} {_format(got)}", flush=True)
    report(rows, stopped, args)
    if "go" in args.client and not args.json:
        go_beside_demo(args)
    return 0


def _format(row: Row) -> str:
    return (
        f"{row['ok_per_s']:6.0f} ok/s  p50 {row['p50_ms']:6.1f} ms  p99 {row['p99_ms']:6.1f} ms"
        f"  server's own p99 {row['server_p99_ms']:6.1f} ms  refused {row['rejected']:.0f}"
        f"  timed out {row['timed_out']:.0f}  errors {row['errors']:.0f}"
        f"  send lag p99 {row['lag_p99_ms']:.1f} ms"
    )


def report(
    rows: dict[str, list[Row]], stopped: dict[str, list[str]], args: argparse.Namespace
) -> None:
    """Each contender's medians over its rounds, and its p99 over the first contender's."""
    medians: dict[str, Row] = {}
    for name, got in rows.items():
        if got:
            medians[name] = {k: statistics.median(float(g[k]) for g in got) for k in got[0]}
    first = next(iter(medians.values()), None)
    for name, row in medians.items():
        row["p99_ratio"] = row["p99_ms"] / first["p99_ms"] if first and first["p99_ms"] else NAN
        if args.json:
            print(json.dumps({"contender": name, "rounds": len(rows[name]), **row}))
    if args.json:
        return
    print(f"\nmedians over the rounds; p99 ratio to {next(iter(medians), '-')}:")
    for name, row in medians.items():
        print(f"  {name:<34} {_format(row)}  p99 x{row['p99_ratio']:.2f}")
    for name, why in stopped.items():
        if why:
            print(f"  {name}: stopped in {len(why)} round(s) (e.g. {why[0]})")
    behind = [r["lag_p99_ms"] for got in rows.values() for r in got if r["lag_p99_ms"] > LAG_MS]
    if behind:
        print(
            f"  in {len(behind)} run(s) the sender itself sent up to {max(behind):.0f} ms late "
            f"(p99 over {LAG_MS:g} ms): those figures are the sender's, not the server's"
        )


if __name__ == "__main__":
    sys.exit(main())
