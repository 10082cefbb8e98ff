"""Tables, headline figures and ``bench/RESULTS.md`` from a comparison run's raw figures.

Pure functions of the raw JSON (plus a few reads of the machine and the environments'
version files): the report can be rebuilt from a saved run with
``python bench/peers/compare.py report bench/out/compare-<time>.json``.

Each cell shows the median of its repeats; ``ok/s`` and ``p99`` also show the range. "Best
peer" is, per column, the best value among the peers (not batchserve) that ran: the most
ok/s, the lowest p99, the highest rate held.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from comparison import real
from comparison.servers import MAIN_PYTHON, PEERS, ROOT, VENVS

FRAMEWORK_P99_MS = 50.0
#: A generator lag (p99 behind its schedule) past which a failed step says more about the
#: machine than the server: the generator could not send as scheduled beside it.
FRAMEWORK_LAG_MS = 5.0
#: Hand-written reading of a run (what its figures say, what would change them), included
#: after the headline figures when present. It names the run it was written for.
DISCUSSION = Path(__file__).resolve().parents[1] / "results_discussion.md"


#: Figures of successful requests only: a run with no success has none (not 0 ms).
_LATENCY_KEYS = ("p50_ms", "p90_ms", "p99_ms", "max_ms")


def _vals(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [
        r[key]
        for r in runs
        if isinstance(r.get(key), int | float) and (key not in _LATENCY_KEYS or r.get("ok"))
    ]


def _med(runs: list[dict[str, Any]], key: str) -> float | None:
    vals = _vals(runs, key)
    return statistics.median(vals) if vals else None


def _range(runs: list[dict[str, Any]], key: str, fmt: str) -> str:
    vals = _vals(runs, key)
    if not vals:
        return "n/a"
    mid = format(statistics.median(vals), fmt)
    if len(vals) == 1 or min(vals) == max(vals):
        return mid
    return f"{mid} [{format(min(vals), fmt)}-{format(max(vals), fmt)}]"


def _f(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def _ratio(v: float | None, best: float | None) -> str:
    if v is None or best is None or best == 0:
        return "n/a"
    return f"{v / best:.2f}x"


def summarize_cell(cell: dict[str, Any]) -> dict[str, Any] | None:
    """Medians of a single-load cell (seed, overload); None if it did not run."""
    if cell.get("error") or not cell["steps"]:
        return None
    runs = cell["steps"][0]["runs"]
    out: dict[str, Any] = {"runs": runs}
    for key in (
        "ok_per_s",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "rejected",
        "timed_out",
        "errors",
        "sent",
        "ok",
        "server_avg_batch",
        "server_items",
        "offered_per_s",
        "achieved_per_s",
        "lag_p99_ms",
        "unsent",
    ):
        out[key] = _med(runs, key)
    if cell["server"] == "batchserve":
        lates = [r.get("server_outcomes", {}).get("late") for r in runs]
        out["late"] = max((x for x in lates if x is not None), default=None)
    return out


def framework_summary(cell: dict[str, Any]) -> dict[str, Any] | None:
    """Highest rate that every repeat held, with its figures, and the first that failed."""
    if not cell["steps"]:
        return None
    best: dict[str, Any] | None = None
    failed: dict[str, Any] | None = None
    for step in cell["steps"]:
        if all(_held(r) for r in step["runs"]):
            best = step
        else:
            failed = step
            break
    out: dict[str, Any] = {"held_rate": best["load"]["rate"] if best else 0.0}
    if best:
        out["p99_ms"] = _med(best["runs"], "p99_ms")
        out["ok_per_s"] = _med(best["runs"], "ok_per_s")
        out["avg_batch"] = _med(best["runs"], "server_avg_batch")
        out["cpu_us"] = _med(best["runs"], "server_cpu_us_per_request")
    if failed:
        r = failed["runs"]
        out["failed_rate"] = failed["load"]["rate"]
        out["failed_p99_ms"] = _med(r, "p99_ms")
        out["failed_ok_share"] = (_med(r, "ok") or 0) / max(1.0, _med(r, "sent") or 1)
        # The generator's own lag (its timer and CPU), not the lag of writes that waited
        # for a connection the server had not answered on yet.
        out["failed_lag_p99_ms"] = _med(r, "dispatch_lag_p99_ms")
    out["cpu_us_by_rate"] = {
        step["load"]["rate"]: _med(step["runs"], "server_cpu_us_per_request")
        for step in cell["steps"]
    }
    return out


def common_cpu(rows: dict[str, dict[str, Any] | None], a: str, b: str) -> tuple[float, ...] | None:
    """(rate, a's, b's) server CPU µs per request at the highest rate both held; None: none."""
    ra, rb = rows.get(a), rows.get(b)
    if not ra or not rb:
        return None
    rates = [
        r
        for r in ra["cpu_us_by_rate"]
        if r <= min(ra["held_rate"], rb["held_rate"])
        and ra["cpu_us_by_rate"].get(r) is not None
        and rb["cpu_us_by_rate"].get(r) is not None
    ]
    if not rates:
        return None
    rate = max(rates)
    return rate, ra["cpu_us_by_rate"][rate], rb["cpu_us_by_rate"][rate]


def _held(run: dict[str, Any]) -> bool:
    sent = run.get("sent", 0) or 1
    return bool(run.get("p99_ms", 1e9) <= FRAMEWORK_P99_MS and run.get("ok", 0) >= 0.99 * sent)


def best_peer(rows: dict[str, dict[str, Any] | None], key: str = "ok_per_s") -> str | None:
    """The peer with the highest ``key``; among those within 1% of it, the lowest p99."""
    cands = {n: s for n, s in rows.items() if n in PEERS and s and s.get(key) is not None}
    if not cands:
        return None
    top = max(s[key] for s in cands.values())
    near = [n for n, s in cands.items() if s[key] >= 0.99 * top]
    return min(near, key=lambda n: cands[n].get("p99_ms") or float("inf"))


def _groups(data: dict[str, Any], scenario: str) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for cell in data["cells"]:
        if cell["scenario"] == scenario:
            groups.setdefault(cell["config"], []).append(cell)
    return groups


def single_load_table(
    cells: list[dict[str, Any]], *, encode_per_s: float | None = None, capacity: float | None = None
) -> tuple[str, dict[str, Any]]:
    """A markdown table of one configuration; also the summaries by server."""
    rows = {c["server"]: summarize_cell(c) for c in cells}
    peer = best_peer(rows)
    best_ok = rows[peer]["ok_per_s"] if peer else None  # type: ignore[index]
    best_p99 = rows[peer]["p99_ms"] if peer else None  # type: ignore[index]
    head = [
        "server",
        "ok/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "avg batch",
        "rejected",
        "timed out",
        "errors",
        "ok/s ÷ best peer",
        "p99 ÷ best peer",
        "sent/s (gen lag p99 ms)",
        "load",
    ]
    if capacity:
        head.insert(2, "% of capacity")
    if encode_per_s:
        head.insert(2, "÷ encode alone")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells:
        s = rows[cell["server"]]
        if s is None:
            why = cell.get("error", "did not run").splitlines()[0][:80]
            lines.append(f"| {cell['server']} | failed: {why} |" + " |" * (len(head) - 2))
            continue
        runs = s["runs"]
        label = cell["server"] + (" (best peer)" if cell["server"] == peer else "")
        vals = [
            label,
            _range(runs, "ok_per_s", ".0f"),
            _f(s["p50_ms"], ".1f"),
            _range(runs, "p99_ms", ".1f"),
            _f(s["max_ms"], ".1f"),
            _f(s["server_avg_batch"], ".1f"),
            _f(s["rejected"], ".0f"),
            _f(s["timed_out"], ".0f"),
            _f(s["errors"], ".0f"),
            _ratio(s["ok_per_s"], best_ok),
            _ratio(s["p99_ms"], best_p99),
            f"{_f(s['achieved_per_s'], '.0f')} ({_f(s['lag_p99_ms'], '.1f')})",
            _f(cell.get("loadavg_1m"), ".1f"),
        ]
        if capacity:
            vals.insert(2, _f(100 * (s["ok_per_s"] or 0) / capacity, ".0f") + "%")
        if encode_per_s:
            vals.insert(2, _ratio(s["ok_per_s"], encode_per_s))
        lines.append("| " + " | ".join(vals) + " |")
    facts = {"rows": rows, "best_ok": best_ok, "best_p99": best_p99, "best_peer": peer}
    return "\n".join(lines), facts


def framework_table(cells: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The framework scenario's table: the highest rate held per server."""
    rows = {c["server"]: framework_summary(c) for c in cells}
    peer = best_peer(rows, "held_rate")
    best = rows[peer]["held_rate"] if peer else None  # type: ignore[index]
    head = [
        "server",
        "highest rate held /s",
        "p99 there ms",
        "avg batch there",
        "next step /s",
        "next step p99 ms",
        "next step ok share",
        "next step generator's own lag p99 ms",
        "server CPU µs/request (held)",
        "÷ best peer",
        "load",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells:
        s = rows[cell["server"]]
        if s is None or (cell.get("error") and not s.get("held_rate")):
            why = cell.get("error", "did not run").splitlines()[0][:80]
            lines.append(f"| {cell['server']} | failed: {why} |" + " |" * (len(head) - 2))
            continue
        label = cell["server"] + (" (best peer)" if cell["server"] == peer else "")
        lines.append(
            "| "
            + " | ".join(
                [
                    label,
                    f"{s['held_rate']:.0f}",
                    _f(s.get("p99_ms"), ".1f"),
                    _f(s.get("avg_batch"), ".1f"),
                    _f(s.get("failed_rate"), ".0f"),
                    _f(s.get("failed_p99_ms"), ".1f"),
                    _f(s.get("failed_ok_share") and 100 * s["failed_ok_share"], ".1f")
                    + ("%" if s.get("failed_ok_share") is not None else ""),
                    _f(s.get("failed_lag_p99_ms"), ".1f"),
                    _f(s.get("cpu_us"), ".0f"),
                    _ratio(s["held_rate"], best),
                    _f(cell.get("loadavg_1m"), ".1f"),
                ]
            )
            + " |"
        )
    return "\n".join(lines), {"rows": rows, "best": best, "best_peer": peer}


# ---------------------------------------------------------------- headline figures


def _line(text: str) -> str:
    return f"- {text}"


def headlines(data: dict[str, Any], facts: dict[str, Any]) -> list[str]:
    """One line per scenario and configuration: batchserve against the best peer.

    What was measured, as ratios; no verdict: what a figure should be is an issue's to say.
    """
    out = []
    for config, f in facts.get("seed", {}).items():
        b = f["rows"].get("batchserve")
        if b is None or f["best_ok"] is None:
            out.append(_line(f"seed, {config}: batchserve or every peer did not run"))
            continue
        ok_ratio = b["ok_per_s"] / f["best_ok"]
        p99_cut = 1 - b["p99_ms"] / f["best_p99"] if f["best_p99"] else 0.0
        out.append(
            _line(
                f"seed, {config}: batchserve serves {b['ok_per_s']:.0f} ok/s = {ok_ratio:.3f}x the "
                f"best peer's {f['best_ok']:.0f}, p99 {b['p99_ms']:.1f} ms vs the best peer's "
                f"{f['best_p99']:.1f} ms: {100 * p99_cut:.0f}% lower",
            )
        )
    for config, f in facts.get("overload", {}).items():
        b = f["rows"].get("batchserve")
        cap = data["extra"].get("capacity_per_s", 2000.0)
        if b is None or f["best_ok"] is None:
            out.append(_line(f"overload, {config}: batchserve or every peer did not run"))
        else:
            share, vs = b["ok_per_s"] / cap, b["ok_per_s"] / f["best_ok"]
            out.append(
                _line(
                    f"overload, {config}: batchserve goodput {b['ok_per_s']:.0f}/s = "
                    f"{100 * share:.0f}% of capacity {cap:.0f}/s "
                    f"and {vs:.2f}x the best peer's {f['best_ok']:.0f}/s",
                )
            )
            late = b.get("late")
            out.append(
                _line(
                    f"overload, {config}: requests batchserve finished past their deadline "
                    f"(its own `late` counter): {late if late is not None else 'n/a'}"
                    f"; slowest success {b['max_ms']:.1f} ms (deadline 250 ms)",
                )
            )
    if "framework" in facts:
        f = facts["framework"]
        b = f["rows"].get("batchserve")
        if b is None or not f["best"]:
            out.append(_line("framework: batchserve or every peer did not run"))
        else:
            vs = b["held_rate"] / f["best"]
            text = (
                f"framework: batchserve holds {b['held_rate']:.0f}/s"
                f" = {vs:.2f}x the best peer's {f['best']:.0f}/s"
            )
            peer_row = f["rows"][f["best_peer"]]
            if (
                b.get("failed_rate") is not None
                and b.get("failed_rate") == peer_row.get("failed_rate")
                and min(b.get("failed_lag_p99_ms") or 0, peer_row.get("failed_lag_p99_ms") or 0)
                > FRAMEWORK_LAG_MS
            ):
                # Both failed at the same step with the generator behind its schedule beside
                # each: the machine (generator and server on the same cores) set the limit.
                text += (
                    f"; both failed at {b['failed_rate']:.0f}/s with the generator itself "
                    f"behind its schedule (p99 > {FRAMEWORK_LAG_MS:g} ms): the ladder ends "
                    "where this machine's cores run out, not where either server does"
                )
            cpu = common_cpu(f["rows"], "batchserve", f["best_peer"])
            if cpu is not None:
                text += (
                    f"; server CPU per request at {cpu[0]:.0f}/s: batchserve {cpu[1]:.0f} µs, "
                    f"{f['best_peer']} {cpu[2]:.0f} µs ({cpu[1] / cpu[2]:.2f}x)"
                )
            out.append(_line(text))
    return out


# ---------------------------------------------------------------- the document


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for peer in (*PEERS, "fastembed"):
        p = VENVS / peer / "versions.json"
        if p.exists():
            out[peer] = json.loads(p.read_text())
    code = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps({d: m.version(d) for d in ('batchserve', 'uvicorn', 'torch', "
        "'sentence-transformers', 'numpy')}))"
    )
    try:
        res = subprocess.run(
            [str(MAIN_PYTHON), "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        out["batchserve"] = json.loads(res.stdout)
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        out["batchserve"]["commit"] = commit + (" (+ uncommitted changes in src/)" if dirty else "")
    except (subprocess.SubprocessError, OSError, ValueError):
        pass
    return out


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        mem_gib = f"{int(mem) / 2**20:.0f} GiB"
    except (OSError, IndexError, ValueError):
        mem_gib = "?"
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem_gib} memory, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


CAVEATS = """\
- **Shared, small machine.** 2 cores run the server under test, its model worker and the
  load generator at once, while other work may run beside them: the "load" column is the
  machine's 1-minute load average as each cell started (above 2, something else competed
  for the CPU). Figures move by several percent between runs; the ranges in brackets are
  the spread of the repeats. Compare within one run, not across runs. The "sent/s" column
  is the rate the generator achieved, with its lag behind schedule (p99).
- **The generator shares the CPU.** At the overload and framework rates the generator's own
  process needs a large part of one core; a server that needs less CPU per request leaves
  more for the generator, and vice versa. Where the generator lags its schedule, the
  latency it reports includes that lag (it measures from the scheduled send time).
- **The synthetic model sleeps.** It stands in for an accelerator: the forward pass leaves
  the CPU free. One forward pass at a time (one device) for every server: a process-wide
  lock in the peers' model, one model worker in batchserve.
- **The caller gives up at its deadline** (`--client-timeout` = `--timeout`), as in the Go
  seed. batchserve gets the deadline (`X-Request-Timeout`) and drops or refuses work that
  cannot meet it; the peers have no such notion and keep computing answers for callers that
  left (the "avg batch" comes from each server's own count of forward passes and items,
  abandoned work included).
- **Each peer's own knobs.** LitServe: `max_batch_size`, `batch_timeout`, one API server,
  one inference worker, unbounded queue. Mosec: `max_batch_size`, `max_wait_time` (whole
  milliseconds), one worker, `--capacity` = the queue size (429 beyond). Ray Serve:
  `@serve.batch(max_batch_size, batch_wait_timeout_s)`, one replica,
  `max_ongoing_requests` = 2x max batch (its default of 5 would cap batches at 5),
  `max_queued_requests` = the queue size (503 beyond), the forward pass in a thread.
  FastAPI: no batching, a sync endpoint in its thread pool, unbounded.
- **MiniLM** runs on the CPU with torch's default threads, so the forward pass competes
  with the HTTP stack and the generator for the same 2 cores; `encode` alone has the
  machine to itself. Every request carries the same short sentence.
"""


def write_results(data: dict[str, Any], path: Path | None) -> str:
    """Render the report of a run (and write it to ``path`` unless None); the text."""
    started = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(data["started"]))
    minutes = (data["finished"] - data["started"]) / 60
    plan = data["plan"]
    parts = [
        "# batchserve beside LitServe, Mosec, Ray Serve and plain FastAPI",
        "",
        f"Generated by `{' '.join(data['argv'])}` on {started} ({minutes:.0f} min). "
        f"Every cell ran {plan['repeats']} time(s); tables show the median "
        "[and the range of the repeats].",
        "",
        f"Machine: {_machine()}. Load average before / after: "
        f"{data.get('loadavg_before')} / {data.get('loadavg_after')}.",
        "",
    ]
    facts: dict[str, Any] = {}
    sections = []
    seed = _groups(data, "seed")
    if seed:
        sections.append(
            "## 1. The seed's scenario\n\n600 requests/s (evenly spaced), 250 ms "
            f"deadline, {plan['seed_s']:g} s per run, the synthetic model "
            "(8 ms + 0.25 ms per item, sleeping), queue bound 64.\n"
        )
        facts["seed"] = {}
        for config, cells in seed.items():
            table, f = single_load_table(cells)
            facts["seed"][config] = f
            sections.append(f"### {config}\n\n{table}\n")
    over = _groups(data, "overload")
    if over:
        cap = data["extra"].get("capacity_per_s", 2000.0)
        for config, cells in over.items():
            table, f = single_load_table(cells, capacity=cap)
            facts.setdefault("overload", {})[config] = f
            rate = cells[0]["steps"][0]["load"]["rate"] if cells[0]["steps"] else 3 * cap
            sections.append(
                f"## 2. Overload\n\n{rate:.0f} requests/s offered = {rate / cap:g}x the "
                f"model's batched capacity ({cap:.0f}/s at batch 32), "
                f"{plan['overload_s']:g} s, 250 ms deadline, {config}, queue "
                f"bound 64. ok/s is goodput: answered within the deadline.\n\n"
                f"{table}\n"
            )
    fw = _groups(data, "framework")
    if fw:
        for config, cells in fw.items():
            table, f = framework_table(cells)
            facts["framework"] = f
            sections.append(
                f"## 3. The framework's own cost\n\n{config}: a model that "
                "returns at once. The rate steps up x1.5 from 250/s, then three "
                "bisections between the last rate held and the first that failed, "
                f"{plan['step_s']:g} s per step; a step holds when p99 <= 50 ms "
                "and >= 99% of requests succeed, in every repeat.\n\n"
                f"{table}\n"
            )
    real_record = data["extra"].get("real")
    if real_record:
        sections.append(
            "## 4. The real model on real texts\n\nall-MiniLM-L6-v2 on the CPU, every "
            "contender alone on the machine in turn (`bench/peers/comparison/real.py` says how): "
            f"the figures and their ratios.\n\n{real.table(real_record)}\n"
        )
    parts.append("## Headline figures\n")
    parts.extend(headlines(data, facts) or ["- no scenario ran"])
    parts.append("")
    if DISCUSSION.exists():
        parts.append(DISCUSSION.read_text().rstrip() + "\n")
    parts.extend(sections)
    parts.append("## Versions\n")
    for name, vers in (data.get("versions") or versions()).items():
        parts.append(f"- {name}: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    parts.append("\n## Commands\n")
    parts.append("Set up the peers' environments once, then run everything:\n")
    parts.append("```\npython bench/peers/setup.py\npython bench/peers/compare.py\n```\n")
    parts.append(
        "Each server as started in the first cell of each scenario, and the "
        "generator's command line (the URL differs per run):\n"
    )
    seen: set[tuple[str, str]] = set()
    parts.append("```")
    for cell in data["cells"]:
        key = (cell["scenario"], cell["server"])
        if key in seen or "command" not in cell:
            continue
        seen.add(key)
        parts.append(f"# {cell['scenario']} / {cell['server']}\n{cell['command']}")
        if cell["steps"]:
            parts.append(cell["steps"][0]["generator"])
    parts.append("```\n")
    parts.append("## Caveats\n")
    parts.append(CAVEATS)
    text = "\n".join(parts)
    if path is not None:
        path.write_text(text)
    return text
