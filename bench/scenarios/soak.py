"""Resident memory over a long soak: one text a request at a steady rate, from outside.

Does the server's memory level off? This script, in one run:

1. starts ``batchserve serve`` as ``scripts/serve`` runs it: the built-in model, no flag
   but its address (``--backend auto``: the engine its verdict picked, which ``/status``
   names); ``--serve-args`` adds flags;
2. sends the paragraphs of Python's reference manual
   (:func:`batchserve.loadgen.texts.reference_paragraphs`, shuffled with a fixed seed and
   cycled), one a request, with the project's open-loop generator in a process of its own
   (``batchserve load --api openai``, Poisson arrivals, no deadline) at ``--rate`` for
   ``--minutes``;
3. every ``--every`` seconds (and on every minute) reads the server's resident memory,
   ``VmRSS`` and its peak ``VmHWM`` from ``/proc/PID/status`` (the server's process and
   any it started, summed), and its ``/status``: requests answered, refused and failed,
   the engine's passes and sub-passes, and the shapes it has seen where ``/status``
   reports them;
4. prints a row a minute (minute 0 is the ready server before the load): RSS, its change
   since minute 1 and since minute ``--settle``, requests answered, refused and failed so
   far; then a summary: RSS at minute ``--settle`` and at the end, the largest and the
   smallest after it, the growth after it (in % and MiB an hour, from the two ends and
   from a least-squares line through every sample after it), and every request the
   generator sent, answered or not (each answer that was not a 200, by kind).

Raw samples, the rows, the summary and the generator's report go to
``bench/out/soak-TIME.json``. ``--json`` prints one object per minute row and one for the
summary, for ``bench/tools/record.py``. ``--minutes 2 --settle 1`` is a quick check.

Run: ``python bench/scenarios/soak.py [--minutes 60] [--rate 60] [--settle 10] [--json]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from batchserve.loadgen.texts import reference_paragraphs
from batchserve_testing.bench import OUT, ROOT, batchserve, load_report, start_load

#: Where the texts the generator sends are written.
TEXTS = OUT / "soak" / "manual.txt"
#: The shuffle's seed: the same sequence of paragraphs every run.
SHUFFLE_SEED = 0
#: How long a ``/status`` read may take before the sample goes without it.
STATUS_TIMEOUT_S = 10.0
#: How long past its schedule the generator may take to finish and report.
REPORT_GRACE_S = 120.0
_MIB = 1024.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One reading of the server, ``t_s`` seconds after the load started (negative: before).

    Attributes:
        t_s: seconds since the generator was started.
        rss_kib: resident memory (``VmRSS``), the server's process and its descendants.
        hwm_kib: their peak resident memory (``VmHWM``), summed.
        processes: processes read (1: the server alone).
        ok: requests answered with success so far (``/status``; None: it did not answer).
        refused: requests refused so far (every reason).
        errors: requests that failed otherwise so far (timed out, cancelled, failed, ...).
        passes: the engine's passes so far (None: not reported).
        subpasses: the engine's sub-passes so far.
        shapes: the input shapes the engine has seen, where ``/status`` reports them.
    """

    t_s: float
    rss_kib: int
    hwm_kib: int
    processes: int
    ok: int | None
    refused: int | None
    errors: int | None
    passes: int | None
    subpasses: int | None
    shapes: int | None


def descendants(pid: int) -> list[int]:
    """Every process ``pid`` started, and theirs, from ``/proc`` (any thread's children)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{parent}/task"):
                with (
                    contextlib.suppress(OSError),
                    open(f"/proc/{parent}/task/{task}/children") as f,
                ):
                    kids = [int(c) for c in f.read().split()]
                    found += kids
                    todo += kids
    return found


def memory_kib(pid: int) -> tuple[int, int, int]:
    """``VmRSS`` and ``VmHWM`` in KiB, summed over ``pid`` and its descendants; processes read.

    A process that ended between listing and reading counts for nothing.
    """
    rss = hwm = read = 0
    for p in [pid, *descendants(pid)]:
        try:
            with open(f"/proc/{p}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        read += 1
        rss += int(fields.get("VmRSS", "0 kB").split()[0])
        hwm += int(fields.get("VmHWM", "0 kB").split()[0])
    return rss, hwm, read


def read_status(url: str) -> dict[str, Any] | None:
    """``GET /status``, or None when it did not answer in time."""
    try:
        with urllib.request.urlopen(f"{url}/status", timeout=STATUS_TIMEOUT_S) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body
    except (OSError, ValueError):
        return None


def shapes_seen(passes: dict[str, Any]) -> int | None:
    """How many input shapes the engine has seen, if its ``passes`` entry says.

    Read as a count, a ``{"seen": N}`` object, or a list or mapping of shapes (its length);
    None where the entry has none.
    """
    shapes = passes.get("shapes")
    if isinstance(shapes, bool) or shapes is None:
        return None
    if isinstance(shapes, int):
        return shapes
    if isinstance(shapes, dict) and isinstance(shapes.get("seen"), int):
        return int(shapes["seen"])
    if isinstance(shapes, list | dict):
        return len(shapes)
    return None


def sample(pid: int, url: str, model: str, t_s: float) -> Sample:
    """Read the server's memory, then its counters (memory first: ``/status`` allocates)."""
    rss, hwm, processes = memory_kib(pid)
    status = read_status(url)
    entry = (status or {}).get("models", {}).get(model)
    if entry is None:
        return Sample(
            t_s=t_s,
            rss_kib=rss,
            hwm_kib=hwm,
            processes=processes,
            ok=None,
            refused=None,
            errors=None,
            passes=None,
            subpasses=None,
            shapes=None,
        )
    passes = entry.get("passes") or {}
    return Sample(
        t_s=t_s,
        rss_kib=rss,
        hwm_kib=hwm,
        processes=processes,
        ok=entry["requests"].get("ok", 0),
        refused=sum(entry.get("refusals", {}).values()),
        errors=sum(entry.get("errors", {}).values()),
        passes=passes.get("passes"),
        subpasses=passes.get("subpasses"),
        shapes=shapes_seen(passes),
    )


def schedule(minutes: int, every_s: float) -> list[float]:
    """Sample times from the load's start: every ``every_s`` seconds and on every minute."""
    end = minutes * 60.0
    times = {round(k * every_s, 3) for k in range(int(end / every_s) + 1)}
    times |= {m * 60.0 for m in range(minutes + 1)}
    return sorted(t for t in times if 0.0 <= t <= end)


def _mib(kib: int) -> float:
    return round(kib / _MIB, 1)


def _change(now: int, then: int | None) -> tuple[float | None, float | None]:
    """Change in MiB and in % of ``then``."""
    if then is None or then == 0:
        return None, None
    return round((now - then) / _MIB, 1), round((now / then - 1) * 100, 2)


def minute_rows(by_minute: dict[int, Sample], settle: int) -> list[dict[str, Any]]:
    """A row per minute sampled: RSS, its changes since minute 1 and ``settle``, counters."""
    first = by_minute.get(1)
    settled = by_minute.get(settle)
    rows = []
    for minute, s in sorted(by_minute.items()):
        since_1 = _change(s.rss_kib, first.rss_kib if first is not None else None)
        since_settle = _change(s.rss_kib, settled.rss_kib if settled is not None else None)
        rows.append(
            {
                "row": "minute",
                "minute": minute,
                "rss_mib": _mib(s.rss_kib),
                "hwm_mib": _mib(s.hwm_kib),
                "since_1_mib": since_1[0] if minute >= 1 else None,
                "since_1_pct": since_1[1] if minute >= 1 else None,
                "since_settle_mib": since_settle[0] if minute >= settle else None,
                "since_settle_pct": since_settle[1] if minute >= settle else None,
                "ok": s.ok,
                "refused": s.refused,
                "errors": s.errors,
                "passes": s.passes,
                "subpasses": s.subpasses,
                "shapes": s.shapes,
                "processes": s.processes,
            }
        )
    return rows


def slope_kib_per_s(samples: list[Sample]) -> float | None:
    """The least-squares slope of RSS over time through ``samples`` (None under two)."""
    if len(samples) < 2:
        return None
    n = len(samples)
    mean_t = sum(s.t_s for s in samples) / n
    mean_r = sum(s.rss_kib for s in samples) / n
    var = sum((s.t_s - mean_t) ** 2 for s in samples)
    if var == 0:
        return None
    return sum((s.t_s - mean_t) * (s.rss_kib - mean_r) for s in samples) / var


def summarize(
    samples: list[Sample], settle_sample: Sample, final: Sample, report: dict[str, Any] | None
) -> dict[str, Any]:
    """The summary: memory after the settling minutes, and every request's outcome.

    Memory is read from ``samples`` (the scheduled ones); the server's counters from
    ``final``, read once the generator had every answer.
    """
    after = [s for s in samples if s.t_s >= settle_sample.t_s]
    end = after[-1]
    hours = (end.t_s - settle_sample.t_s) / 3600
    growth = end.rss_kib - settle_sample.rss_kib
    slope = slope_kib_per_s(after)
    out: dict[str, Any] = {
        "row": "summary",
        "settle_minute": round(settle_sample.t_s / 60),
        "end_minute": round(end.t_s / 60, 2),
        "rss_settle_mib": _mib(settle_sample.rss_kib),
        "rss_end_mib": _mib(end.rss_kib),
        "rss_max_after_settle_mib": _mib(max(s.rss_kib for s in after)),
        "rss_min_after_settle_mib": _mib(min(s.rss_kib for s in after)),
        "hwm_end_mib": _mib(end.hwm_kib),
        "growth_mib": round(growth / _MIB, 1),
        "growth_pct": round(growth / settle_sample.rss_kib * 100, 2),
        "growth_mib_per_hour": round(growth / _MIB / hours, 1) if hours > 0 else None,
        "fit_mib_per_hour": None if slope is None else round(slope * 3600 / _MIB, 1),
        "samples_after_settle": len(after),
        "server_ok": final.ok,
        "server_refused": final.refused,
        "server_errors": final.errors,
        "passes": final.passes,
        "subpasses": final.subpasses,
        "shapes": final.shapes,
    }
    if report is not None:
        out |= {
            "sent": report["sent"],
            "ok": report["ok"],
            "not_ok": report["sent"] - report["ok"],
            "rejected": report["rejected"],
            "timed_out": report["timed_out"],
            "errors": report["errors"],
            "unsent": report.get("unsent", 0),
            "not_ok_by_kind": {
                **{f"rejected_{k}": v for k, v in report.get("rejected_by_status", {}).items()},
                **{f"error_{k}": v for k, v in report.get("errors_by_kind", {}).items()},
                "timed_out_server": report.get("timed_out_server", 0),
                "timed_out_client": report.get("timed_out_client", 0),
            },
            "achieved_per_s": report.get("achieved_per_s"),
            "p50_ms": report["p50_ms"],
            "p99_ms": report["p99_ms"],
        }
    return out


def _num(x: float | int | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_row(row: dict[str, Any], shapes: bool) -> None:
    """One minute's line of the table."""
    since_1 = (
        "-"
        if row["since_1_mib"] is None
        else f"{row['since_1_mib']:+.1f} ({row['since_1_pct']:+.2f}%)"
    )
    since_settle = (
        "-"
        if row["since_settle_mib"] is None
        else f"{row['since_settle_mib']:+.1f} ({row['since_settle_pct']:+.2f}%)"
    )
    line = (
        f"{row['minute']:>6} {row['rss_mib']:>9.1f} {row['hwm_mib']:>9.1f} {since_1:>18} "
        f"{since_settle:>18} {_num(row['ok'], 'd'):>9} {_num(row['refused'], 'd'):>8} "
        f"{_num(row['errors'], 'd'):>7} {_num(row['passes'], 'd'):>8} "
        f"{_num(row['subpasses'], 'd'):>10}"
    )
    if shapes:
        line += f" {_num(row['shapes'], 'd'):>7}"
    print(line, flush=True)


def print_header(settle: int, shapes: bool) -> None:
    """The table's header."""
    line = (
        f"{'minute':>6} {'RSS MiB':>9} {'peak MiB':>9} {'since min 1':>18} "
        f"{f'since min {settle}':>18} {'answered':>9} {'refused':>8} {'errors':>7} "
        f"{'passes':>8} {'sub-passes':>10}"
    )
    if shapes:
        line += f" {'shapes':>7}"
    print(line, flush=True)


def print_summary(s: dict[str, Any]) -> None:
    """The summary's lines."""
    print(
        f"\nRSS at minute {s['settle_minute']}: {s['rss_settle_mib']:.1f} MiB; at the end "
        f"(minute {s['end_minute']:g}): {s['rss_end_mib']:.1f} MiB; after minute "
        f"{s['settle_minute']}: largest {s['rss_max_after_settle_mib']:.1f}, smallest "
        f"{s['rss_min_after_settle_mib']:.1f} MiB ({s['samples_after_settle']} samples); "
        f"peak (VmHWM) {s['hwm_end_mib']:.1f} MiB"
    )
    print(
        f"growth after minute {s['settle_minute']}: {s['growth_mib']:+.1f} MiB "
        f"({s['growth_pct']:+.2f}%), {_num(s['growth_mib_per_hour'], '+.1f')} MiB/hour "
        f"end to end, {_num(s['fit_mib_per_hour'], '+.1f')} MiB/hour fitted through the samples"
    )
    if "sent" in s:
        kinds = ", ".join(f"{k} {v}" for k, v in s["not_ok_by_kind"].items() if v) or "none"
        print(
            f"requests: {s['sent']} sent, {s['ok']} answered 200, {s['not_ok']} not "
            f"({kinds}); achieved {s['achieved_per_s']:.1f}/s, p50 {s['p50_ms']:.1f} ms, "
            f"p99 {s['p99_ms']:.1f} ms"
        )
    else:
        print("requests: the generator printed no report")
    server = (
        f"the server counted {_num(s['server_ok'], 'd')} answered, "
        f"{_num(s['server_refused'], 'd')} refused, {_num(s['server_errors'], 'd')} failed; "
        f"its engine ran {_num(s['passes'], 'd')} passes, {_num(s['subpasses'], 'd')} sub-passes"
    )
    if s["shapes"] is not None:
        server += f", {s['shapes']} shapes seen"
    print(server)


def write_texts() -> Path:
    """The manual's paragraphs, shuffled (fixed seed), one a line, for the generator."""
    texts = list(reference_paragraphs())
    random.Random(SHUFFLE_SEED).shuffle(texts)
    TEXTS.parent.mkdir(parents=True, exist_ok=True)
    TEXTS.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return TEXTS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=int, default=60, help="the load's length (default 60)")
    ap.add_argument("--rate", type=float, default=60.0, help="requests a second (default 60)")
    ap.add_argument(
        "--settle", type=int, default=10, help="the minute growth is counted from (default 10)"
    )
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--seed", type=int, default=0, help="the arrivals' seed")
    ap.add_argument("--serve-args", default="", help="extra flags for batchserve serve, one string")
    ap.add_argument("--json", action="store_true", help="one JSON object per row and summary")
    args = ap.parse_args(argv)
    if args.minutes < 1:
        ap.error(f"--minutes must be >= 1, got {args.minutes}")
    if not 1 <= args.settle <= args.minutes:
        ap.error(f"--settle must be within 1..--minutes ({args.minutes}), got {args.settle}")
    if args.every <= 0 or args.rate <= 0:
        ap.error("--every and --rate must be > 0")
    texts = write_texts()
    started = time.strftime("%Y%m%d-%H%M%S")
    samples: list[Sample] = []
    by_minute: dict[int, Sample] = {}
    report: dict[str, Any] | None = None
    shapes = False
    with batchserve(shlex.split(args.serve_args)) as srv:
        status = read_status(srv.url) or {}
        models: dict[str, dict[str, Any]] = status.get("models", {})
        model, entry = next(iter(models.items()), ("", {}))
        engine: dict[str, Any] = entry.get("engine") or {}
        workers = entry.get("settings", {}).get("workers", "?")
        shapes = shapes_seen(entry.get("passes") or {}) is not None
        out = sys.stderr if args.json else sys.stdout
        print(
            f"batchserve serve {args.serve_args}".rstrip()
            + f" (pid {srv.proc.pid}): {model} on {engine.get('backend', '?')}/"
            f"{engine.get('precision', '?')}, {workers} workers x {engine.get('threads', '?')} "
            "threads; "
            f"{args.rate:g} requests/s, one paragraph each, for {args.minutes} min",
            file=out,
            flush=True,
        )
        by_minute[0] = sample(srv.proc.pid, srv.url, model, 0.0)
        samples.append(by_minute[0])
        if args.json:
            print(json.dumps(minute_rows(by_minute, args.settle)[0]), flush=True)
        else:
            print_header(args.settle, shapes)
            print_row(minute_rows(by_minute, args.settle)[0], shapes)
        load = start_load(
            srv.url,
            {
                "api": "openai",
                "model": model,
                "texts": texts,
                "arrivals": "poisson",
                "rate": f"{args.rate:g}",
                "duration": f"{args.minutes * 60}s",
                "seed": args.seed,
            },
        )
        t0 = time.monotonic()
        for t in schedule(args.minutes, args.every)[1:]:
            time.sleep(max(0.0, t0 + t - time.monotonic()))
            if srv.proc.poll() is not None or load.poll() not in (None, 0):
                print(f"stopped at {t:g} s: the server or the generator exited", file=out)
                break
            s = sample(srv.proc.pid, srv.url, model, t)
            samples.append(s)
            if t % 60 == 0:
                by_minute[int(t // 60)] = s
                row = minute_rows(by_minute, args.settle)[-1]
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print_row(row, shapes)
        try:
            report = load_report(load, REPORT_GRACE_S)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"the generator: {exc}", file=out)
            load.kill()
        # The counters once every answer is in (memory stays the last scheduled sample's).
        final = sample(srv.proc.pid, srv.url, model, time.monotonic() - t0)
    rows = minute_rows(by_minute, args.settle)
    settled = by_minute.get(args.settle)
    summary = summarize(samples, settled, final, report) if settled is not None else None
    raw = OUT / f"soak-{started}.json"
    raw.write_text(
        json.dumps(
            {
                "command": "python bench/scenarios/soak.py " + shlex.join(sys.argv[1:]),
                "settings": vars(args),
                "model": model,
                "engine": engine,
                "samples": [asdict(s) for s in samples],
                "rows": rows,
                "summary": summary,
                "load": report,
            },
            indent=1,
        )
        + "\n"
    )
    if summary is None:
        print(f"no sample at minute {args.settle}: no summary (raw: {raw})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print_summary(summary)
    print(f"raw samples: {raw.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
