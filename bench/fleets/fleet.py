"""Replicas behind nginx, measured, beside what the fleet simulator predicts.

Starts three replicas of ``batchserve serve`` (a sleeping model: 20 ms passes of at most 2
items, so 100 requests/s per replica) behind Debian's nginx configured by
``deploy/nginx/batchserve.conf`` (the harness of ``tests/reliability/test_fleet_nginx.py``),
with front doors to 1, 2 and 3 replicas. For each fleet size it sends an open-loop load
under and past the fleet's capacity with the project's load generator, and runs
:func:`batchserve.sim.simulate_fleet` on the same schedule (same settings, ``least_conn``
as nginx routes, each pass costing 20 ms + ``--overhead``). Then it rolls a restart through
the fleet under load, and kills one replica with SIGKILL under load.

``python bench/fleets/fleet.py`` prints a table; ``--json`` one object per measured row (keys
``replicas, routing, offered_per_s, ok_per_s, p50_ms, p99_ms, rejected, lost``, and the
simulator's ``predicted_*``), then one for the rolling restart and one for the SIGKILL.
About a minute. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from typing import Any

from batchserve.loadgen.config import LoadConfig
from batchserve.sim import simulate_fleet
from batchserve.units import parse_duration
from batchserve_testing.bench import NGINX_CONF
from batchserve_testing.fleet import (
    MODEL,
    PASS_COST,
    REPLICA_CAPACITY_PER_S,
    SIM_CONFIG,
    SIM_OVERHEAD_S,
    Fleet,
)
from batchserve_testing.harness import LoadRun, percentile, run_load, unique_texts

DEADLINE_S = 2.0
LOADS = (0.8, 1.33)  # offered, as a share of the fleet's capacity


def config(url: str, rate: float, duration_s: float, tag: str) -> LoadConfig:
    return LoadConfig(
        url=url,
        model=MODEL,
        texts=unique_texts(int(rate * duration_s) + 1, tag),
        timeout_s=DEADLINE_S,
        rate=rate,
        duration_s=duration_s,
        warm_connections=8,
    )


def lost(run: LoadRun) -> int:
    return sum(1 for s in run.status if s not in (200, 429))


def measured(run: LoadRun, duration_s: float) -> dict[str, Any]:
    ok = [run.latency_s(i) for i in run.indices(200)]
    return {
        "offered_per_s": round(run.n / duration_s, 1),
        "ok_per_s": round(len(ok) / duration_s, 1),
        "p50_ms": round(percentile(ok, 50) * 1e3, 2),
        "p99_ms": round(percentile(ok, 99) * 1e3, 2),
        "rejected": run.count(429),
        "lost": lost(run),
    }


def row(fleet: Fleet, k: int, rate: float, duration_s: float, overhead_s: float) -> dict[str, Any]:
    cfg = config(fleet.doors[k], rate, duration_s, f"r{k}-{rate:g}")
    run = run_load(cfg)
    sim = simulate_fleet(
        replicas=k,
        routing="least_conn",
        config=SIM_CONFIG,
        cost=PASS_COST,
        arrivals=cfg.schedule(),
        timeout_s=DEADLINE_S,
        duration_s=duration_s,
        overhead_s=overhead_s,
    ).summary
    out: dict[str, Any] = {"scenario": "load", "replicas": k, "routing": "least_conn"}
    out.update(measured(run, duration_s))
    out.update(
        predicted_ok_per_s=round(sim.ok / duration_s, 1),
        predicted_p50_ms=round(sim.p50_ms, 2),
        predicted_p99_ms=round(sim.p99_ms, 2),
        predicted_rejected=sim.rejected,
        overhead_s=overhead_s,
    )
    out["ok_ratio"] = round(out["ok_per_s"] / out["predicted_ok_per_s"], 3)
    out["p50_ratio"] = round(out["p50_ms"] / out["predicted_p50_ms"], 3)
    time.sleep(0.5)
    return out


def rolling_restart(fleet: Fleet, rate: float, duration_s: float) -> dict[str, Any]:
    exits: list[int | None] = []
    took: list[float] = []

    def roll() -> None:
        time.sleep(1.0)
        for i in range(len(fleet.ports)):
            t = time.monotonic()
            exits.append(fleet.restart(i))
            took.append(time.monotonic() - t)
            time.sleep(0.5)

    mark = fleet.nginx.log_offset()
    roller = threading.Thread(target=roll, daemon=True)
    roller.start()
    run = run_load(config(fleet.url, rate, duration_s, "roll"))
    roller.join(timeout=60)
    accesses = [a for a in fleet.nginx.accesses(mark) if a.uri == "/v1/embeddings"]
    out: dict[str, Any] = {"scenario": "rolling_restart", "replicas": len(fleet.ports)}
    out.update(measured(run, duration_s))
    out.update(
        statuses={str(k): v for k, v in run.statuses().items()},
        exit_statuses=exits,
        restart_s=[round(t, 2) for t in took],
        retried_by_nginx=sum(1 for a in accesses if len(a.attempts) > 1),
    )
    time.sleep(0.5)
    return out


def sigkill(fleet: Fleet, rate: float, duration_s: float, victim: int = 2) -> dict[str, Any]:
    def kill() -> None:
        time.sleep(duration_s / 3)
        fleet.kill(victim)

    mark = fleet.nginx.log_offset()
    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    run = run_load(config(fleet.url, rate, duration_s, "kill"))
    killer.join(timeout=10)
    accesses = [a for a in fleet.nginx.accesses(mark) if a.uri == "/v1/embeddings"]
    addr = fleet.address(victim)
    held = sum(1 for a in accesses for at in a.attempts if at[0] == addr and at[1] == 502 and at[2])
    fleet.start(victim)
    out: dict[str, Any] = {"scenario": "sigkill", "replicas": len(fleet.ports)}
    out.update(measured(run, duration_s))
    out.update(
        statuses={str(k): v for k, v in run.statuses().items()},
        held_at_kill=held,
        rescued_by_retry=held - out["lost"],
        refused_connections_after=sum(
            1 for a in accesses for at in a.attempts if at[0] == addr and at[2] == 0
        ),
    )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument("--duration", default="4s", help="each load row's length (4s)")
    p.add_argument(
        "--overhead",
        default=f"{SIM_OVERHEAD_S * 1e3:g}ms",
        help="what each replica adds to a pass, for the prediction (0.5ms: what "
        "`batchserve demo` measures on this machine)",
    )
    args = p.parse_args()
    duration_s = parse_duration(args.duration, name="--duration")
    overhead_s = parse_duration(args.overhead, name="--overhead")
    rows: list[dict[str, Any]] = []
    fleet = Fleet(NGINX_CONF, 3)
    try:
        run_load(config(fleet.url, 100, 1.0, "warm"))  # every replica's cost model learns
        time.sleep(0.5)
        for k in (1, 2, 3):
            for share in LOADS:
                rate = math.floor(share * k * REPLICA_CAPACITY_PER_S)
                rows.append(row(fleet, k, rate, duration_s, overhead_s))
                emit(rows[-1], args.json)
        carried = 0.4 * 3 * REPLICA_CAPACITY_PER_S  # what two replicas carry
        rows.append(rolling_restart(fleet, carried, 16.0))
        emit(rows[-1], args.json)
        rows.append(sigkill(fleet, carried, 5.0))
        emit(rows[-1], args.json)
    finally:
        fleet.close()
    return 0


def emit(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(r), flush=True)
        return
    if r["scenario"] == "load":
        print(
            f"{r['replicas']} replica(s) at {r['offered_per_s']:6.1f}/s: ok {r['ok_per_s']:6.1f}/s "
            f"(predicted {r['predicted_ok_per_s']:6.1f}, x{r['ok_ratio']:.3f}), "
            f"p50 {r['p50_ms']:6.2f} ms (predicted {r['predicted_p50_ms']:6.2f}, "
            f"x{r['p50_ratio']:.3f}), p99 {r['p99_ms']:6.2f} ms (predicted "
            f"{r['predicted_p99_ms']:6.2f}), 429 {r['rejected']}, lost {r['lost']}",
            flush=True,
        )
    else:
        extra = {k: v for k, v in r.items() if k not in ("scenario",)}
        print(f"{r['scenario']}: {extra}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
