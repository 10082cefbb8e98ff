"""Triton's perf_analyzer and ``batchserve load`` at the same rate against one server.

One ``batchserve serve`` (the synthetic model, a pass of 2 ms + 0.1 ms per item, max wait
2 ms; or ``--spec minilm``, the built-in model) is measured at each ``--rates`` by:

* ``perf_analyzer`` in its default Triton mode over HTTP, ``--request-rate-range R``, with
  binary tensors and with JSON tensors (``--input/--output-tensor-format``), its usual
  stabilisation over ``--window`` measurement windows: the last window's throughput and
  client p50/p99, and the server's side it read from the statistics extension;
* ``batchserve load --api kserve --rate R`` for ``--seconds`` (JSON tensors, open loop,
  latency from each scheduled send).

Both send the same one text (a 15-word sentence) in each request.

The server's own record of each run (``/v2/models/synthetic/stats`` before and after: mean
queue wait and pass per item, mean time arrival to answer) is printed beside each client's
view, so a difference between the two tools shows whose it is. perf_analyzer is the one
``scripts/install-tools perf_analyzer`` unpacks (as for the tests). Needs about 10 s per rate.

Run: ``.venv/bin/python bench/perf_analyzer_vs_load.py [--rates 100,400] [--seconds 4]
[--spec minilm]``
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import pathlib
import subprocess
import sys
from typing import Any

import httpx
from _harness import batchserve

from batchserve.models.loader import default_model_name
from batchserve_testing.tools import find_perf_analyzer

SYNTHETIC = "synthetic:fixed=2ms,per_item=0.1ms"
#: Both tools send this one text: perf_analyzer's default (random 128-character strings)
#: would cost MiniLM several times more tokens than the load generator's words.
TEXT = "the quick brown fox jumps over the lazy dog while the batcher waits two ms"
MODEL = "synthetic"  # the served model's name: set from --spec in main()


def server_stats(url: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{url}/v2/models/{MODEL}/stats").json()["model_stats"][0]
    return stats


def server_view(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Mean ms per request (success) and per item (queue, pass) between two readings."""

    def delta(key: str) -> tuple[int, int]:
        a, b = before["inference_stats"][key], after["inference_stats"][key]
        return b["count"] - a["count"], b["ns"] - a["ns"]

    ok, ok_ns = delta("success")
    items, queue_ns = delta("queue")
    _, infer_ns = delta("compute_infer")
    passes = after["execution_count"] - before["execution_count"]
    return {
        "requests": ok,
        "server_ms": ok_ns / ok / 1e6 if ok else 0.0,
        "queue_ms": queue_ns / items / 1e6 if items else 0.0,
        "pass_ms": infer_ns / items / 1e6 if items else 0.0,
        "batch": items / passes if passes else 0.0,
    }


def perf_analyzer(
    url: str, rate: float, window_ms: int, fmt: str, stability: int
) -> dict[str, float]:
    binary, env = find_perf_analyzer()
    out = pathlib.Path("/tmp") / f"perf_analyzer-{rate:g}-{fmt}.csv"
    cmd = [
        binary, "-m", MODEL, "-u", url.removeprefix("http://"), "-i", "http",
        "--request-rate-range", f"{rate:g}", "--measurement-interval", str(window_ms),
        "--input-tensor-format", fmt, "--output-tensor-format", fmt,
        "-s", str(stability), "-f", str(out), "--string-data", TEXT,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"perf_analyzer failed:\n{done.stdout}{done.stderr}")
    row = next(csv.DictReader(io.StringIO(out.read_text())))
    return {
        "achieved": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) / 1e3,
        "p99_ms": float(row["p99 latency"]) / 1e3,
    }


def batchserve_load(url: str, rate: float, seconds: float) -> dict[str, float]:
    texts = pathlib.Path("/tmp/perf_analyzer_vs_load.txt")
    texts.write_text(TEXT + "\n")
    cmd = [
        sys.executable, "-m", "batchserve", "load", url, "--api", "kserve", "--model", MODEL,
        "--rate", f"{rate:g}", "--duration", f"{seconds:g}s", "--json", "--quiet",
        "--texts", str(texts),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"batchserve load failed:\n{done.stdout}{done.stderr}")
    report = json.loads(done.stdout.splitlines()[-1])
    return {
        "achieved": float(report["ok_per_s"]),
        "p50_ms": float(report["p50_ms"]),
        "p99_ms": float(report["p99_ms"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="100,400", help="requests per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="batchserve load's schedule")
    parser.add_argument("--window", type=int, default=2000, help="perf_analyzer's window, ms")
    parser.add_argument(
        "--stability", type=int, default=10, help="perf_analyzer's -s, percent (its default 10)"
    )
    parser.add_argument("--spec", default=SYNTHETIC, help="the model to serve (e.g. minilm)")
    args = parser.parse_args()
    spec = args.spec
    global MODEL
    MODEL = default_model_name(spec)
    print(f"server: batchserve serve --model {spec} --max-wait 2ms")
    head = (
        f"{'tool':<28}{'rate':>6}{'ok/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'| server: total':>16}{'queue':>8}{'pass':>8}{'batch':>7}"
    )
    print(head)
    with batchserve(["--model", spec, "--max-wait", "2ms"]) as server:
        for rate in (float(r) for r in args.rates.split(",")):
            for name in ("perf_analyzer (binary)", "perf_analyzer (json)", "batchserve load"):
                before = server_stats(server.url)
                if name == "batchserve load":
                    client = batchserve_load(server.url, rate, args.seconds)
                else:
                    fmt = name.split("(")[1].rstrip(")")
                    client = perf_analyzer(server.url, rate, args.window, fmt, args.stability)
                view = server_view(before, server_stats(server.url))
                print(
                    f"{name:<28}{rate:>6g}{client['achieved']:>9.1f}{client['p50_ms']:>9.2f}"
                    f"{client['p99_ms']:>9.2f}{view['server_ms']:>14.2f}  "
                    f"{view['queue_ms']:>8.2f}{view['pass_ms']:>8.2f}{view['batch']:>7.2f}"
                )
    print(
        "ok/s, p50, p99: the client's view (perf_analyzer: its last stable window; batchserve "
        "load: the whole schedule, latency from each scheduled send). server: the same run "
        "as the server accounted it, mean ms per request (total) and per item (queue, pass)."
    )


if __name__ == "__main__":
    main()
