"""A cell: one server started, each load run on it (repeated), stopped; and its record.

:class:`Plan` says how long each kind of run lasts and how often it is repeated;
:class:`Bench` runs cells and keeps every figure, the commands and the failures, in the
shape the report (:mod:`comparison.report`) reads. Order of events in a cell: start the
server, wait until it answers, warm it up (discarded), then for each repeat: read its batch
counters, run the generator (:func:`measure`), wait until the server is idle, read the
counters again (their difference gives the run's average batch, whatever the server), and
stop the server.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from comparison.generator import Load, drive, generator_argv
from comparison.real import RealPlan
from comparison.servers import Knobs, ModelSpec, Running, available, describe, start

__all__ = ["Bench", "Plan", "loadavg", "measure", "short"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """How long each kind of run lasts, and how often it is repeated."""

    repeats: int
    seed_s: float
    overload_s: float
    step_s: float
    real_s: float
    warmup_s: float
    quick: bool

    @classmethod
    def make(cls, *, quick: bool, repeats: int | None) -> Plan:
        if quick:
            return cls(
                repeats=repeats or 1,
                seed_s=1.5,
                overload_s=3.0,
                step_s=1.5,
                real_s=4.0,
                warmup_s=0.5,
                quick=True,
            )
        return cls(
            repeats=repeats or 2,
            seed_s=5.0,
            overload_s=10.0,
            step_s=3.0,
            real_s=20.0,
            warmup_s=1.0,
            quick=False,
        )


def _wait_idle(run: Running, limit_s: float = 60.0) -> None:
    """Wait until the server's batch counters stop moving (a backlog drained)."""
    deadline = time.monotonic() + limit_s
    last = run.batch_counters()
    stable = 0
    while time.monotonic() < deadline and stable < 3:
        time.sleep(0.2)
        now = run.batch_counters()
        stable = stable + 1 if now == last else 0
        last = now


def measure(run: Running, load: Load, seed: int) -> dict[str, Any]:
    """One generator run with the server-side batch counters around it."""
    before = run.batch_counters()
    m_before = run.metrics() if run.name == "batchserve" else {}
    cpu0, t0 = run.cpu_s(), time.monotonic()
    summary = drive(run.url, load, seed)
    wall = time.monotonic() - t0
    cpu = run.cpu_s() - cpu0  # before the idle wait's own requests to the server
    _wait_idle(run)
    after = run.batch_counters()
    batches, items = after[0] - before[0], after[1] - before[1]
    out = dict(summary)
    out.update(
        server_batches=batches,
        server_items=items,
        server_avg_batch=round(items / batches, 2) if batches else None,
        wall_s=round(wall, 2),
        # The server's own CPU over the run (every process of it), per request sent: what
        # a request costs it, apart from the generator's share of the machine.
        server_cpu_s=round(cpu, 3),
        server_cpu_us_per_request=round(1e6 * cpu / max(1, summary.get("sent", 0)), 1),
    )
    if run.name == "batchserve":
        m_after = run.metrics()
        out["server_outcomes"] = {
            k[len("batchserve_items_total[") : -1]: m_after[k] - m_before.get(k, 0.0)
            for k in m_after
            if k.startswith("batchserve_items_total[")
        }
    return out


class Bench:
    """Runs cells and keeps every figure, the commands and the failures."""

    def __init__(self, plan: Plan, servers: list[str], logs: Path) -> None:
        self.plan = plan
        self.servers = servers
        self.logs = logs
        self.cells: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.batchserve_flags: tuple[str, ...] = ()  # added to every batchserve cell
        self.real: RealPlan | None = None  # the real scenario's settings
        self.real_contenders: list[str] = []
        self.real_json = False  # print the real scenario's rows as JSON lines

    def cell(
        self,
        scenario: str,
        config: str,
        server: str,
        model: ModelSpec,
        knobs: Knobs,
        loads: list[Load],
        *,
        stop_when: Any = None,
        fresh_each_repeat: bool = False,
    ) -> dict[str, Any]:
        """Start ``server``, run each load ``plan.repeats`` times, stop it; the cell's record.

        ``stop_when(runs)`` (optional) ends the list of loads early once it returns True for
        the repeats of one load (the framework scenario's rate steps). With
        ``fresh_each_repeat`` every repeat gets a newly started server (after an overload,
        a server with an unbounded queue would still be working off the last run's backlog).
        """
        tag = f"{scenario}-{config}".replace(" ", "_").replace(",", "")
        if server == "batchserve" and self.batchserve_flags:
            knobs = replace(knobs, extra=knobs.extra + self.batchserve_flags)
        rec: dict[str, Any] = {
            "scenario": scenario,
            "config": config,
            "server": server,
            "knobs": asdict(knobs),
            "model": asdict(model),
            "steps": [],
            "loadavg_1m": next(iter(loadavg()), None),
        }
        why = available(server, model)
        if why:
            rec["error"] = why
            self.cells.append(rec)
            print(f"  {server:<10} skipped: {why}", flush=True)
            return rec
        rounds = self.plan.repeats if fresh_each_repeat else 1
        per_round = 1 if fresh_each_repeat else self.plan.repeats
        runs_by_load: list[list[dict[str, Any]]] = [[] for _ in loads]
        try:
            for round_ in range(rounds):
                done = self._round(
                    rec,
                    server,
                    model,
                    knobs,
                    loads,
                    runs_by_load,
                    seeds=range(round_ * per_round, (round_ + 1) * per_round),
                    tag=tag,
                    stop_when=stop_when,
                    last=round_ == rounds - 1,
                )
                if not done:
                    break
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
            print(f"  {server:<10} FAILED: {rec['error'][:400]}", flush=True)
        self.cells.append(rec)
        return rec

    def _round(
        self,
        rec: dict[str, Any],
        server: str,
        model: ModelSpec,
        knobs: Knobs,
        loads: list[Load],
        runs_by_load: list[list[dict[str, Any]]],
        *,
        seeds: range,
        tag: str,
        stop_when: Any,
        last: bool,
    ) -> bool:
        """One server start: warm up, then each load once per seed. False: stop the cell."""
        t0 = time.monotonic()
        run = start(server, model, knobs, logs=self.logs, tag=tag)
        try:
            rec["command"] = describe(run.argv)
            rec.setdefault("startup_s", []).append(round(time.monotonic() - t0, 1))
            warm = Load(
                rate=min(100.0, loads[0].rate),
                duration_s=self.plan.warmup_s,
                deadline_ms=max(loads[0].deadline_ms, 1000.0),
            )
            drive(run.url, warm, seed=999)
            _wait_idle(run)
            for i, load in enumerate(loads):
                runs = runs_by_load[i]
                for seed in seeds:
                    runs.append(measure(run, load, seed=seed))
                    time.sleep(0.3)
                if not last:
                    continue
                step = {
                    "load": asdict(load),
                    "runs": runs,
                    "generator": describe(generator_argv(run.url, load, 0)),
                }
                rec["steps"].append(step)
                print(f"  {server:<10} {short(step)}", flush=True)
                if stop_when is not None and stop_when(runs):
                    break
        finally:
            run.stop()
        return True


def short(step: dict[str, Any]) -> str:
    """One console line for a step: offered rate and the repeats' key figures."""
    parts = []
    for r in step["runs"]:
        batch = r.get("server_avg_batch")
        parts.append(
            f"{r.get('ok_per_s', 0):7.0f} ok/s p99 {r.get('p99_ms', 0):7.1f} ms "
            f"rej {r.get('rejected', 0):5d} t/o {r.get('timed_out', 0):5d} "
            f"err {r.get('errors', 0):4d} batch {batch if batch is not None else '-'}"
        )
    return f"{step['load']['rate']:7.0f}/s: " + " | ".join(parts)


def loadavg() -> list[float]:
    """The machine's load averages (1, 5, 15 minutes); empty where /proc has none."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []
