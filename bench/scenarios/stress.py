"""The reliability scenarios at length, with one table of figures.

Usage: python bench/scenarios/stress.py [--only overload,soak,...] [--quick] [--soak 5m] [--json]

Runs the reliability scenarios (:mod:`batchserve_testing.scenarios`, which the tests of
``tests/reliability/`` run at CI lengths) with
longer durations than CI can afford, each against a real ``batchserve serve`` in a
subprocess with the fault-injecting model, and prints a table: scenario, offered load,
goodput (and its share of what could be served: the capacity under overload, else the
offer), p99 latency of the successes, refusals, requests lost (must be 0), the server's
RSS before and after, whether the server's counters add up, and a note on what the
scenario is about. ``--quick`` uses the CI durations. A benchmark, not a test: it prints
figures and asserts nothing; the machine is shared, so timings are noisy.

Default lengths: overload 60 s at 5x capacity; poison, crashes and transient faults 30 s
each; a stuck model for 5 s in a 12 s run; 1,000 clients that leave, 5 rounds; SIGTERM under
load, and a second SIGTERM; soak 5 minutes at 70% of capacity.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from batchserve.models.faults import crashes_on
from batchserve.units import parse_duration
from batchserve_testing import scenarios
from batchserve_testing.scenarios import Figures


def poison_texts(n: int) -> list[str]:
    texts = [f"text-{i:07d}" for i in range(n)]
    for i in range(7, n, 20):
        texts[i] = "poison"
    return texts


def run_overload(work: pathlib.Path, quick: bool) -> Figures:
    f = scenarios.overload(duration_s=20.0 if quick else 60.0, factor=5.0)
    f.extra["note"] = (
        f"goodput {f.goodput / (f.capacity or math.nan):.0%} of capacity; "
        f"429 p99 {f.refusal_p99_s * 1e3:.1f} ms; late 200s {f.extra['late_ok']} "
        f"(client's stopwatch {f.extra['late_ok_client']}); "
        f"slowest answer {f.extra['max_response_s'] * 1e3:.0f} ms "
        f"(deadline {f.extra['deadline_s'] * 1e3:.0f} ms)"
    )
    return f


def run_poison(work: pathlib.Path, quick: bool) -> Figures:
    duration = 4.0 if quick else 30.0
    f = scenarios.failing_model(
        work,
        fault_env={"BATCHSERVE_FAULT_POISON": "poison"},
        texts=poison_texts(int(400 * duration) + 1),
        duration_s=duration,
        rate=400.0,
        scenario="poison",
    )
    run = f.run
    assert run is not None
    poisoned = [i for i in range(run.n) if run.text(i) == "poison"]
    wrong = sum(
        1
        for i in range(run.n)
        if (run.status[i] == 422) != (run.text(i) == "poison") or run.status[i] not in (200, 422)
    )
    mixed = sum(1 for b in f.extra["record"] if "poison" in b and len(b) > 1)
    f.extra["note"] = (
        f"{len(poisoned)} poisoned, {wrong} answered wrongly; {mixed} mixed batches; "
        f"{f.extra['bisect_calls']} bisection calls"
    )
    return f


def run_crashes(work: pathlib.Path, quick: bool) -> Figures:
    rate, seed = 0.05, 11
    f = scenarios.failing_model(
        work,
        fault_env={"BATCHSERVE_FAULT_CRASH_RATE": str(rate), "BATCHSERVE_FAULT_SEED": str(seed)},
        duration_s=4.0 if quick else 30.0,
        rate=400.0,
        scenario="crash",
    )
    run = f.run
    assert run is not None
    bad = {i for i in range(run.n) if crashes_on(run.text(i), rate, seed)}
    failed = {i for i in range(run.n) if run.status[i] == 422}
    f.extra["note"] = (
        f"injected {len(bad) / run.n:.2%} of inputs, clients saw {len(failed) / run.n:.2%} "
        f"errors; {'the same requests' if bad == failed else 'DIFFERENT requests'}"
    )
    return f


def run_flaky(work: pathlib.Path, quick: bool) -> Figures:
    rate = 0.1
    f = scenarios.failing_model(
        work,
        fault_env={"BATCHSERVE_FAULT_FLAKY_RATE": str(rate), "BATCHSERVE_FAULT_SEED": "5"},
        duration_s=4.0 if quick else 30.0,
        rate=400.0,
        scenario="flaky",
    )
    run = f.run
    assert run is not None
    f.extra["note"] = (
        f"{rate:.0%} of passes failed; clients saw {run.count(422) / run.n:.2%} errors "
        f"after {f.extra['bisect_calls']} retried passes"
    )
    return f


def run_stuck(work: pathlib.Path, quick: bool) -> Figures:
    stall = 1.5 if quick else 5.0
    f = scenarios.stuck_model(work, stall_at_s=1.0 if quick else 3.0, stall_s=stall, after_s=4.0)
    run = f.run
    assert run is not None
    _start, end = f.extra["stall"]
    timed_out = run.indices(504)
    slowest = max((run.response_s(i) for i in timed_out), default=math.nan)
    offsets = run.result.offsets
    recovered = [i for i in range(run.n) if offsets[i] >= end and run.status[i] == 200]
    back = min((offsets[i] - end for i in recovered), default=math.nan)
    f.extra["note"] = (
        f"stuck {stall:g} s: {len(timed_out)} 504s, the slowest at {slowest * 1e3:.0f} ms "
        f"(deadline {f.extra['deadline_s'] * 1e3:.0f} ms); served again {back * 1e3:.0f} ms "
        "after recovery"
    )
    return f


def run_leaving(work: pathlib.Path, quick: bool) -> Figures:
    f = scenarios.leaving_clients(work, clients=1000, rounds=3 if quick else 5)
    rounds = f.extra["rounds"]
    seen = sum(len(r["leavers_seen"]) for r in rounds)
    f.extra["note"] = (
        f"{len(rounds)} rounds of 1000: cancelled {[r['cancelled'] for r in rounds]}, "
        f"computed {seen}; tasks {rounds[0]['tasks_idle']:.0f} idle, "
        f"{max(r['tasks_busy'] for r in rounds):.0f} busy, {rounds[-1]['tasks_after']:.0f} after; "
        f"RSS after each round {[round(r['rss'] / 1e6) for r in rounds]} MB"
    )
    return f


def run_shutdown(work: pathlib.Path, quick: bool) -> Figures:
    # The model stalls from just before the signal to 6 s after it: the drain has work.
    f = scenarios.shutdown_under_load(
        work,
        duration_s=8.5 if quick else 12.0,
        signal_at_s=1.5 if quick else 5.0,
        drain_stall_s=6.0,
    )
    run = f.run
    assert run is not None
    computed = sorted(f.extra["computed"])
    answered = sorted(run.text(i) for i in run.indices(200))
    f.extra["note"] = (
        f"exit {f.extra['exit_status']} {f.extra['exit_after_s']:.2f} s after SIGTERM; "
        f"statuses {f.extra['statuses']}; every accepted request answered: "
        f"{computed == answered}"
    )
    return f


def run_second_sigterm(work: pathlib.Path, quick: bool) -> Figures:
    f = scenarios.shutdown_under_load(
        work, duration_s=2.0, signal_at_s=1.0, second_signal_after_s=0.5, stall=True
    )
    said = [line for line in f.extra["stderr"].splitlines() if "second" in line]
    f.extra["note"] = (
        f"exit {f.extra['exit_status']} {f.extra['exit_after_s']:.2f} s after the first "
        f"SIGTERM (0.5 s after it, the second); said: {said[0] if said else 'nothing'}"
    )
    f.lost = 0  # a forced stop drops accepted requests by design; the note says how many
    return f


def run_soak(work: pathlib.Path, quick: bool, soak_s: float) -> Figures:
    f = scenarios.soak(duration_s=30.0 if quick else soak_s, load=0.7)
    f.extra["note"] = (
        f"p99 of successes {f.extra['p99_first_s'] * 1e3:.0f} ms in the first minute, "
        f"{f.extra['p99_last_s'] * 1e3:.0f} ms in the last; RSS growth {f.rss_growth:+.1%}"
    )
    return f


SCENARIOS: dict[str, Callable[..., Figures]] = {
    "overload": run_overload,
    "poison": run_poison,
    "crashes": run_crashes,
    "flaky": run_flaky,
    "stuck": run_stuck,
    "leaving": run_leaving,
    "shutdown": run_shutdown,
    "second-sigterm": run_second_sigterm,
    "soak": run_soak,
}


def row(f: Figures) -> dict[str, Any]:
    counts = f.counts
    adds_up = "-"
    if counts is not None:
        try:
            counts.check()
            adds_up = "yes"
        except AssertionError:
            adds_up = "NO"
    return {
        "scenario": f.scenario,
        "offered": f.offered,
        "offered_per_s": round(f.offered_rate, 1) if f.duration_s else None,
        "goodput_per_s": round(f.goodput, 1) if f.duration_s else None,
        "capacity_per_s": round(f.capacity, 1) if f.capacity else None,
        "ok_p99_ms": None if math.isnan(f.ok_p99_s) else round(f.ok_p99_s * 1e3, 1),
        "refusals": f.refusals,
        "lost": f.lost,
        "rss_before_mb": round(f.rss_before / 1e6, 1),
        "rss_after_mb": round(f.rss_after / 1e6, 1),
        "counters_add_up": adds_up,
        "counters": counts.row() if counts is not None else "",
        "note": f.extra.get("note", ""),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    def cell(v: Any) -> str:
        return "-" if v is None else str(v)

    head = (
        f"{'scenario':<20}{'offered':>16}{'goodput':>18}{'p99 ok':>10}{'refusals':>10}"
        f"{'lost':>6}{'RSS before->after':>22}{'add up':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        offered = f"{r['offered']}" + (
            f" ({r['offered_per_s']:g}/s)" if r["offered_per_s"] is not None else ""
        )
        goodput = cell(r["goodput_per_s"]) + "/s"
        if r["goodput_per_s"] is not None and r["offered_per_s"]:
            # Against what could be served: the capacity under overload, else the offer.
            servable = min(r["offered_per_s"], r["capacity_per_s"] or math.inf)
            goodput += f" ({r['goodput_per_s'] / servable:.0%})"
        p99 = "-" if r["ok_p99_ms"] is None else f"{r['ok_p99_ms']:g} ms"
        rss = f"{r['rss_before_mb']:g} -> {r['rss_after_mb']:g} MB"
        print(
            f"{r['scenario']:<20}{offered:>16}{goodput:>18}{p99:>10}{r['refusals']:>10}"
            f"{r['lost']:>6}{rss:>22}{r['counters_add_up']:>8}"
        )
    print()
    for r in rows:
        print(f"{r['scenario']}: {r['note']}")
        if r["counters"]:
            print(f"    server counters: {r['counters']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--only", help="comma-separated: " + ", ".join(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="the CI durations")
    parser.add_argument("--soak", default="5m", help="soak duration (default 5m)")
    parser.add_argument("--json", action="store_true", help="one JSON object per scenario")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}")
    soak_s = parse_duration(args.soak, name="--soak")
    rows = []
    with tempfile.TemporaryDirectory(prefix="batchserve-stress-") as tmp:
        for name in names:
            work = pathlib.Path(tmp) / name
            work.mkdir()
            t0 = time.monotonic()
            print(f"running {name}...", file=sys.stderr, flush=True)
            fn = SCENARIOS[name]
            f = fn(work, args.quick, soak_s) if name == "soak" else fn(work, args.quick)
            r = row(f)
            r["wall_s"] = round(time.monotonic() - t0, 1)
            rows.append(r)
            if args.json:
                print(json.dumps(r), flush=True)
    if not args.json:
        print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
