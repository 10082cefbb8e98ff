"""Passes formed by tokens versus by count: MiniLM served on a realistic length mix, side by side.

A transformer pads every text of a pass to the longest, so a pass costs about ``fixed +
per_token * count * longest``. This benchmark serves the built-in all-MiniLM-L6-v2, one text
per request, open loop past saturation with a 1 s deadline (the generator gives up there too),
and lays side by side, in one run:

1. **encode alone**: ``SentenceTransformer.encode`` over the whole text set in this machine's
   best way (it sorts all texts by length, then batches: no padding to speak of), at several
   batch sizes and at the server's thread count and torch's default: the ceiling. Beside
   it, fastembed (ONNX Runtime in process, on batchserve's ONNX export of the same weights;
   ``python bench/peers/setup.py --peers fastembed``), as given and sorted by length.
2. **served**: ``batchserve serve`` by tokens (``--batch-by tokens``, the default for MiniLM),
   by count (``--batch-by count``) at the same settings, by count at a small batch (the
   best count-only setting for this mix on a CPU), by tokens with two model threads
   (``--threads 2``; the default is one on two cores), and Infinity (``infinity-emb``, which sorts
   its queue by length) when its venv is there (``python bench/peers/setup.py --peers
   infinity``). Each on ``mixed`` texts (3 to 200 words, uniformly: queries to passages) and,
   for batchserve, on uniform ``short`` texts (8 words), where passes by tokens must lose
   nothing.
3. **the simulator's prediction** of the same two policies, with the sub-pass cost that
   the served run by tokens fitted (``/status``): the same policy code on virtual time,
   each pass costing its length-sorted sub-passes.

Every served row has the demo's keys, plus ``server``, ``config``, ``load`` and, for
batchserve, the padding waste (padded tokens / real tokens) from ``/status``. The summary
prints, per repeat and as the median: by tokens / by count at the same settings, by tokens /
the best count-only setting, by tokens / Infinity, by tokens / encode alone.

Run: ``.venv/bin/python bench/peers/token_batching.py [--repeats 2] [--seconds 20] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from comparison import generator
from comparison.servers import (
    MAIN_PYTHON,
    ROOT,
    Knobs,
    ModelSpec,
    available,
    describe,
    server_env,
    start,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

OUT = ROOT / "bench" / "out" / "token_batching"
DEADLINE_MS = 1000.0
MAX_BATCH = 32
SMALL_BATCH = 2
TEXT_COUNT = 1024
LOADS = {"mixed": "3:200", "short": "8"}
ENCODE_BATCHES = (8, 16, 32, 64)

#: (label, server, max batch, extra flags for batchserve, loads)
CONFIGS: tuple[tuple[str, str, int, tuple[str, ...], tuple[str, ...]], ...] = (
    ("by tokens", "batchserve", MAX_BATCH, ("--batch-by", "tokens"), ("mixed", "short")),
    ("by count", "batchserve", MAX_BATCH, ("--batch-by", "count"), ("mixed", "short")),
    (
        f"by count, batch {SMALL_BATCH}",
        "batchserve",
        SMALL_BATCH,
        ("--batch-by", "count"),
        ("mixed",),
    ),
    ("infinity", "infinity", MAX_BATCH, (), ("mixed",)),
    (
        "by tokens, 2 threads",
        "batchserve",
        MAX_BATCH,
        ("--batch-by", "tokens", "--threads", "2"),
        ("mixed",),
    ),
)


def write_texts(words: str) -> Path:
    """The load's texts, written for the generator (the project's generator, seed 0)."""
    from batchserve.loadgen.texts import generate_texts
    from batchserve.units import parse_int_range

    path = OUT / f"texts-{words.replace(':', '-')}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = generate_texts(TEXT_COUNT, words=parse_int_range(words, name="words"), seed=0)
    path.write_text("\n".join(texts) + "\n")
    return path


THREADS = sorted({1, os.cpu_count() or 1})


def json_of(argv: list[str]) -> dict[str, Any]:
    """Run a measuring script to its end; the JSON object it prints last."""
    res = subprocess.run(
        argv, cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=1800, check=True
    )
    data: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return data


def encode_alone(texts: Path) -> dict[str, float]:
    """items/s of ``encode`` over the whole set (sorted by length, cut by it), by threads and
    batch size: :mod:`batchserve_testing.encode_alone` in a process of its own."""
    argv = [str(MAIN_PYTHON), "-m", "batchserve_testing.encode_alone", str(texts)]
    argv += ["--threads", ",".join(map(str, THREADS))]
    argv += ["--batch-sizes", ",".join(map(str, ENCODE_BATCHES)), "--normalize"]
    return {
        f"{row['threads']} threads, batch {row['batch_size']}": row["items_per_s"]
        for row in json_of(argv)["rows"]
    }


def fastembed_alone(texts: Path) -> dict[str, float] | None:
    """fastembed's texts/s on the same texts, in its venv, on batchserve's ONNX export."""
    python = ROOT / "bench" / ".venvs" / "fastembed" / "bin" / "python"
    if not python.exists():
        return None
    from batchserve.engines.embeddings import builtin_path
    from batchserve.engines.export import ensure_exported
    from batchserve.engines.runtime import default_cache_dir

    exported = ensure_exported(builtin_path(), "onnx", default_cache_dir())
    script = ROOT / "bench" / "peers" / "fastembed_encode.py"
    return json_of(
        [
            str(python),
            str(script),
            "--model-file",
            str(exported.model_file),
            "--source",
            str(builtin_path()),
            "--texts",
            str(texts),
            "--batch-sizes",
            ",".join(map(str, ENCODE_BATCHES)),
            "--threads",
            ",".join(map(str, THREADS)),
        ]
    )


def status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/status", timeout=10) as resp:
        models: dict[str, dict[str, Any]] = json.loads(resp.read())["models"]
        return models["bench"]


def drive(url: str, texts: Path, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """One open-loop run (poisson arrivals, the deadline sent and kept by the client)."""
    load = generator.Load(rate=rate, duration_s=seconds, deadline_ms=DEADLINE_MS)
    return generator.drive(url, load, seed, texts=texts, arrivals="poisson")


def serve_and_drive(
    label: str,
    server: str,
    max_batch: int,
    extra: tuple[str, ...],
    load: str,
    texts: Path,
    rate: float,
    seconds: float,
    seed: int,
) -> dict[str, Any]:
    knobs = Knobs(
        max_batch=max_batch,
        max_wait_ms=2.0,
        queue_size=1024,
        timeout_ms=DEADLINE_MS,
        extra=extra,
    )
    tag = f"{label}-{load}-{seed}".replace(" ", "_").replace(",", "")
    run = start(server, ModelSpec(kind="minilm"), knobs, logs=OUT / "logs", tag=tag)
    try:
        # Warm-up: a few seconds at the same rate, not counted (lazy inits, the cost model).
        drive(run.url, texts, rate, 3.0, seed + 1000)
        time.sleep(DEADLINE_MS / 1e3 + 0.5)
        before = status(run.url) if server == "batchserve" else None
        row = drive(run.url, texts, rate, seconds, seed)
        after = status(run.url) if server == "batchserve" else None
    finally:
        run.stop()
    row.update(server=server, config=label, load=load, command=describe(run.argv))
    if before is not None and after is not None:
        passes = after["batches"]["passes"] - before["batches"]["passes"]
        items = after["batches"]["items"] - before["batches"]["items"]
        row["server_avg_batch"] = round(items / passes, 2) if passes else None
        tok_a, tok_b = after.get("tokens"), before.get("tokens")
        if tok_a and tok_b and tok_a["real"] > tok_b["real"]:
            row["padding_waste"] = round(
                (tok_a["padded"] - tok_b["padded"]) / (tok_a["real"] - tok_b["real"]), 3
            )
            row["token_cost"] = {
                "fixed_s": tok_a["fixed_s"],
                "per_token_s": tok_a["per_token_s"],
                "attention_s": tok_a.get("attention_s", 0.0),
            }
    return row


def predict(row: dict[str, Any], texts: Path, rate: float, seconds: float) -> dict[str, Any]:
    """The simulator's ok/s and p99, by tokens and by count, with the served fit."""
    from batchserve.config import BatchConfig, CostEstimate
    from batchserve.models.token_counts import estimate_tokens
    from batchserve.sim import simulate
    from batchserve.subpasses import PassCost
    from batchserve.workload.arrivals import arrival_times

    cost = row["token_cost"]
    # The served policy's fit is of one sub-pass (its driver's overhead inside).
    subpass = PassCost(
        fixed_s=cost["fixed_s"],
        per_token_s=cost["per_token_s"],
        attention_s=cost.get("attention_s", 0.0),
    )
    pool = texts.read_text().splitlines()
    arrivals = arrival_times(rate=rate, duration_s=seconds, arrivals="poisson", seed=7)
    rng = random.Random(7)
    sizes = [estimate_tokens(rng.choice(pool), 256) for _ in arrivals]
    out = {}
    for by in ("tokens", "count"):
        r = simulate(
            config=BatchConfig(max_batch_size=MAX_BATCH, max_wait_s=0.002, batch_by=by),
            cost=CostEstimate(fixed_s=0.0, per_item_s=0.0),
            arrivals=arrivals,
            timeout_s=DEADLINE_MS / 1e3,
            duration_s=seconds,
            sizes=sizes,
            subpass=subpass,
        )
        out[by] = {"ok_per_s": round(r.summary.ok_per_s, 1), "p99_ms": round(r.summary.p99_ms, 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per run")
    ap.add_argument("--mixed-rate", type=float, default=40.0, help="requests/s, mixed texts")
    ap.add_argument("--short-rate", type=float, default=600.0, help="requests/s, short texts")
    ap.add_argument("--json", action="store_true", help="one JSON object per row")
    ap.add_argument("--no-encode", action="store_true", help="skip encode alone")
    ap.add_argument("--loads", default="mixed,short", help="which loads (default: both)")
    ap.add_argument(
        "--configs", help="labels of CONFIGS to run, separated by ; (default: all)", default=""
    )
    args = ap.parse_args(argv)
    files = {load: write_texts(words) for load, words in LOADS.items()}
    rates = {"mixed": args.mixed_rate, "short": args.short_rate}
    encode = {} if args.no_encode else encode_alone(files["mixed"])
    best_encode = max(encode.values(), default=0.0)
    print(
        "encode alone, mixed texts, items/s: "
        + (", ".join(f"{k}: {v:.1f}" for k, v in encode.items()) or "not measured"),
        flush=True,
    )
    fastembed = None if args.no_encode else fastembed_alone(files["mixed"])
    print(
        "fastembed alone (ONNX), mixed texts, items/s: "
        + (
            ", ".join(f"{k}: {v:.1f}" for k, v in fastembed.items())
            if fastembed
            else "not measured (python bench/peers/setup.py --peers fastembed)"
        ),
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for label, server, max_batch, extra, loads in CONFIGS:
            if args.configs and label not in args.configs.split(";"):
                continue
            why = available(server, ModelSpec(kind="minilm"))
            if why is not None:
                print(f"  {server}: skipped ({why})")
                continue
            for load in loads:
                if load not in args.loads.split(","):
                    continue
                row = serve_and_drive(
                    label,
                    server,
                    max_batch,
                    extra,
                    load,
                    files[load],
                    rates[load],
                    args.seconds,
                    repeat,
                )
                row["repeat"] = repeat
                if label == "by tokens" and load == "mixed" and "token_cost" in row:
                    row["predicted"] = predict(row, files[load], rates[load], args.seconds)
                rows.append(row)
                print(
                    json.dumps(row)
                    if args.json
                    else f"  [{repeat}] {load:5} {label:18} ok/s {row['ok_per_s']:6.1f}  "
                    f"p99 {row['p99_ms']:7.1f} ms  rejected {row['rejected']:5}  timed out "
                    f"{row['timed_out']:4}  batch {row.get('server_avg_batch') or 0:4.1f}  "
                    f"waste {row.get('padding_waste', '-')}"
                    + (f"  fit {row['token_cost']}" if "token_cost" in row else "")
                    + (f"  predicted {row['predicted']}" if "predicted" in row else ""),
                    flush=True,
                )
    print(summary(rows, best_encode))
    return 0


def summary(rows: list[dict[str, Any]], best_encode: float) -> str:
    def ok(label: str, load: str) -> list[float]:
        return [r["ok_per_s"] for r in rows if r["config"] == label and r["load"] == load]

    def ratio(a: list[float], b: list[float]) -> str:
        if not a or not b or not all(b):
            return "n/a"
        each = [x / y for x, y in zip(a, b, strict=False)]
        return f"{statistics.median(each):.2f}x (runs: {', '.join(f'{x:.2f}' for x in each)})"

    tokens = ok("by tokens", "mixed")
    lines = [
        "",
        "mixed texts (3-200 words), 1 s deadline, past saturation:",
        f"  by tokens / by count, same settings (batch {MAX_BATCH}): "
        + ratio(tokens, ok("by count", "mixed")),
        f"  by tokens / by count, batch {SMALL_BATCH}: "
        + ratio(tokens, ok(f"by count, batch {SMALL_BATCH}", "mixed")),
        "  by tokens / infinity: " + ratio(tokens, ok("infinity", "mixed")),
        f"  by tokens / best encode alone ({best_encode:.1f}/s): "
        + ratio(tokens, [best_encode] * len(tokens)),
        "  by tokens with 2 threads / best encode alone: "
        + ratio(ok("by tokens, 2 threads", "mixed"), [best_encode] * len(tokens)),
        "short texts (8 words):",
        "  by tokens / by count: " + ratio(ok("by tokens", "short"), ok("by count", "short")),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
