"""The seed scenario driven by an independent generator: aiohttp, not batchserve's own.

``compare.py`` drives every server with ``batchserve load``, a generator this project wrote
and tuned; a figure that holds only under our own generator proves less. Here an ordinary
asyncio client does the same open loop: ``aiohttp`` (one process, one event loop, its
default connection pool with no limit), a request sent every ``1 / --rate`` seconds from a
fixed schedule whatever the answers, each a plain OpenAI ``POST /v1/embeddings`` with no
deadline header (the server's ``--timeout`` applies), given up after ``--deadline`` as the
seed's callers do; latency from the scheduled send time.

Servers (started as ``compare.py`` starts them, one at a time, the order alternating per
round): batchserve and Mosec (``bench/peers/setup.py`` first), the seed's model (8 ms per
call + 0.25 ms per item, sleeping), max batch 32, max wait 2 ms, queue 64, deadline 250 ms.
Per server, the median over rounds of: goodput, p50 and p99 of the successes, give-ups and
refusals, and the server's own CPU per request; then batchserve's p99 over Mosec's, both
from the same run, on the same machine as the generator.

aiohttp in one process keeps the seed's 600/s on schedule; at the 3x overload's 6,000/s it
is bistable on this machine (it either keeps up or falls seconds behind and stays there,
whichever server it drives): the script says when a run's send lag makes it the
generator's figure rather than the server's.

Run: ``.venv/bin/python bench/independent_seed.py [--rounds 3] [--duration 5] [--rate 600]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from compare_servers import BENCH, MODEL_NAME, Knobs, ModelSpec, start

from batchserve.workload.summary import percentile

try:
    import aiohttp
except ImportError:  # pragma: no cover - a bench's dependency, not the package's
    sys.exit("independent_seed.py needs aiohttp: .venv/bin/pip install aiohttp")

SERVERS = ("batchserve", "mosec")
#: The generator's own send lag (p99) past which a run measured the generator.
LAG_MS = 5.0


async def open_loop(url: str, rate: float, duration_s: float, deadline_s: float) -> dict[str, Any]:
    """Send on schedule; the successes' latencies and a count of every other ending."""
    latencies: list[float] = []
    own: list[float] = []  # the server's own time of each success, where it says
    endings: dict[str, int] = {}
    body = {"model": MODEL_NAME, "input": "hello world"}
    timeout = aiohttp.ClientTimeout(total=deadline_s)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(at: float) -> None:
            try:
                async with session.post(f"{url}/v1/embeddings", json=body) as resp:
                    await resp.read()
                    status = resp.status
                    timing = resp.headers.get("Server-Timing", "")
            except TimeoutError:
                endings["gave up"] = endings.get("gave up", 0) + 1
                return
            except aiohttp.ClientError as exc:
                key = type(exc).__name__
                endings[key] = endings.get(key, 0) + 1
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
        n = int(rate * duration_s)
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
    lags.sort()
    own.sort()
    nan = float("nan")
    return {
        "server_p99_ms": 1e3 * percentile(own, 0.99) if own else nan,
        # How late the generator itself sent (its own loop's lag): past a few ms, the
        # server did not get the load as scheduled.
        "lag_p99_ms": 1e3 * percentile(lags, 0.99),
        "sent": n,
        "ok_per_s": len(latencies) / duration_s,
        "p50_ms": 1e3 * percentile(latencies, 0.5) if latencies else nan,
        "p99_ms": 1e3 * percentile(latencies, 0.99) if latencies else nan,
        "endings": endings,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--deadline", type=float, default=0.25, help="seconds")
    args = parser.parse_args()
    knobs = Knobs(max_batch=32, max_wait_ms=2.0, queue_size=64, timeout_ms=args.deadline * 1e3)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SERVERS}
    for r in range(args.rounds):
        for server in SERVERS if r % 2 == 0 else SERVERS[::-1]:
            run = start(
                server, ModelSpec(kind="sleep"), knobs, logs=BENCH / "out" / "logs", tag="indep"
            )
            try:
                asyncio.run(open_loop(run.url, 100.0, 1.0, 1.0))  # warm up
                cpu0 = run.cpu_s()
                out = asyncio.run(open_loop(run.url, args.rate, args.duration, args.deadline))
                out["cpu_us"] = 1e6 * (run.cpu_s() - cpu0) / out["sent"]
            finally:
                run.stop()
            runs[server].append(out)
            print(
                f"round {r + 1} {server:<10} {out['ok_per_s']:6.0f} ok/s  p50 "
                f"{out['p50_ms']:6.1f} ms  p99 {out['p99_ms']:6.1f} ms  "
                f"(server's own p99 {out['server_p99_ms']:.1f} ms)  "
                f"server CPU {out['cpu_us']:5.0f} us/request  send lag p99 "
                f"{out['lag_p99_ms']:.1f} ms  {out['endings'] or ''}",
                flush=True,
            )
    print(f"\naiohttp open loop, {args.rate:g}/s for {args.duration:g} s, {args.rounds} rounds")
    print("| server | ok/s | p50 ms | p99 ms (range) | its own p99 ms | server CPU us/request |")
    print("|---|---:|---:|---:|---:|---:|")
    p99: dict[str, float] = {}
    for server in SERVERS:
        rs = runs[server]
        p99[server] = statistics.median(x["p99_ms"] for x in rs)
        lo, hi = min(x["p99_ms"] for x in rs), max(x["p99_ms"] for x in rs)
        print(
            f"| {server} | {statistics.median(x['ok_per_s'] for x in rs):.0f} | "
            f"{statistics.median(x['p50_ms'] for x in rs):.1f} | {p99[server]:.1f} "
            f"({lo:.1f}-{hi:.1f}) | {statistics.median(x['server_p99_ms'] for x in rs):.1f} | "
            f"{statistics.median(x['cpu_us'] for x in rs):.0f} |"
        )
    behind = [x["lag_p99_ms"] for rs in runs.values() for x in rs if x["lag_p99_ms"] > LAG_MS]
    if behind:
        print(
            f"warning: in {len(behind)} run(s) the generator itself sent up to "
            f"{max(behind):.0f} ms late (p99 over {LAG_MS:g} ms): those figures are the "
            "generator's, not the server's (aiohttp in one process falls behind past a few "
            "thousand requests/s, and once behind it stays behind)"
        )
    ratio = p99["batchserve"] / p99["mosec"]
    print(f"\nbatchserve p99 / Mosec p99 = {ratio:.2f}x")


if __name__ == "__main__":
    main()
