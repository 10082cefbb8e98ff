"""The Go seed and `batchserve demo`, side by side in one run, with ratios.

Usage: python bench/seed_vs_go.py [--repeats 3] [--shared ../shared]

Needs a Go toolchain (`apt-get install golang-go`); without one it says so and runs only the
demo. Each side runs `--repeats` times; the table shows the median of each figure per row.
A benchmark, not a test: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROW = re.compile(
    r"^(?P<name>.{26}) +(?P<ok>\d+) ok/s +batch +(?P<batch>[\d.]+) +p50 +(?P<p50>[\d.]+) ms"
    r" +p99 +(?P<p99>[\d.]+) ms +rejected +(?P<rej>\d+) +timed out +(?P<to>\d+)"
)
FIELDS = ("ok_per_s", "avg_batch", "p50_ms", "p99_ms", "rejected", "timed_out")


def go_source(shared: pathlib.Path) -> str:
    seed = next(shared.glob("seeds/000_*.txt"))
    text = seed.read_text()
    return text[text.index("// batcher.go") :]


def run_go(shared: pathlib.Path) -> list[dict[str, float | str]]:
    with tempfile.TemporaryDirectory() as tmp:
        main = pathlib.Path(tmp) / "main.go"
        main.write_text(go_source(shared))
        subprocess.run(["go", "build", "-o", "seed", "main.go"], cwd=tmp, check=True)
        out = subprocess.run(
            [str(pathlib.Path(tmp) / "seed")], capture_output=True, text=True, check=True
        ).stdout
    rows: list[dict[str, float | str]] = []
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            rows.append(
                {
                    "name": m["name"].strip(),
                    "ok_per_s": float(m["ok"]),
                    "avg_batch": float(m["batch"]),
                    "p50_ms": float(m["p50"]),
                    "p99_ms": float(m["p99"]),
                    "rejected": float(m["rej"]),
                    "timed_out": float(m["to"]),
                }
            )
    return rows


def run_demo() -> list[dict[str, float | str]]:
    out = subprocess.run(
        [sys.executable, "-m", "batchserve", "demo", "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def median_rows(runs: list[list[dict[str, float | str]]]) -> list[dict[str, float | str]]:
    out = []
    for i, first in enumerate(runs[0]):
        row: dict[str, float | str] = {"name": first["name"]}
        for f in FIELDS:
            row[f] = statistics.median(float(r[i][f]) for r in runs)
        out.append(row)
    return out


def fmt(row: dict[str, float | str]) -> str:
    return (
        f"{row['name']!s:<26} {row['ok_per_s']:5.0f} ok/s  batch {row['avg_batch']:4.1f}  "
        f"p50 {row['p50_ms']:5.1f} ms  p99 {row['p99_ms']:6.1f} ms  "
        f"rejected {row['rejected']:4.0f}  timed out {row['timed_out']:4.0f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shared", type=pathlib.Path, default=ROOT.parent / "shared")
    args = ap.parse_args()
    go_runs: list[list[dict[str, float | str]]] = []
    demo_runs: list[list[dict[str, float | str]]] = []
    have_go = shutil.which("go") is not None
    for _ in range(args.repeats):
        # Interleaved, so that both sides see the same machine conditions.
        if have_go:
            go_runs.append(run_go(args.shared))
        demo_runs.append(run_demo())
    demo = median_rows(demo_runs)
    print(f"median of {args.repeats} runs each; 600 requests/s for 1.5 s, 250 ms deadline\n")
    if have_go:
        go = median_rows(go_runs)
        print("Go seed:")
        for row in go:
            print("  " + fmt(row))
    else:
        go = []
        print("Go seed: no Go toolchain here (apt-get install golang-go); demo only")
    print("\nbatchserve demo:")
    for row in demo:
        print("  " + fmt(row))
    if go:
        print("\nratios, batchserve / Go, same row (ok/s higher is better; p99 lower is better):")
        for g, d in zip(go, demo[: len(go)], strict=True):
            ok = float(d["ok_per_s"]) / max(float(g["ok_per_s"]), 1e-9)
            p99 = float(d["p99_ms"]) / max(float(g["p99_ms"]), 1e-9)
            print(f"  {g['name']!s:<26} ok/s x{ok:5.2f}   p99 x{p99:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
