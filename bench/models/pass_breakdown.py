"""Where a pass's time and FLOPs go, per engine, on real text sent 32 per request.

For each ``--spec`` (default: every fixed engine of the built-in model, torch, ONNX
Runtime and OpenVINO at float32 and int8, at the default threads), requests of
``--per-request`` texts (32) of the realistic mix (paragraphs of Python's reference
manual, :func:`batchserve.loadgen.texts.reference_paragraphs`, a seeded sample of
``--texts``) are embedded in process, two ways, alternated over ``--repeats``:

* **padded**: the request as one pass padded to its longest text (the engine's tokenizer,
  then its forward on the whole pass: how the engines ran a pass before sub-passes);
* **cut**: the engine's own call, which runs the pass as length-sorted sub-passes
  (:mod:`batchserve.engines.passes`), its cost learned as it goes (a warm-up request first).

Printed per engine and way: texts/s (best repeat), **tokens computed / real tokens**
(from the engine's statistics, or the pass's shape when padded), tokenize's share of the
time, **useful GFLOP/s** and its **share of the machine's matrix-product rate** at the same
threads. Useful FLOPs count only real tokens: a text of ``l`` tokens costs
``2 * P * l + 4 * layers * d * l * l`` FLOPs, where ``P`` is the parameters of the encoder
layers (the weights a token is multiplied by: 10.6 M for MiniLM-L6, so 21 MFLOP a token)
and the second term is attention's (``QK^T`` and ``AV``, ``2 * l * d`` FLOPs each per token
and layer); embeddings are lookups and cost none. The machine's rate is a torch float32
matrix product at the model's shapes (2048 x 384 @ 384 x 1536, the feed-forward's first
layer over 2048 tokens; :func:`batchserve_testing.arithmetic.matmul_rate`), at the same
threads, the best of runs before and between the engines (a busy machine's neighbours slow
both alike); int8 engines may exceed it.

``--fixed-cost`` measures instead where the engines' sub-pass prior comes from
(:data:`batchserve.engines.passes.CPU_PRIOR`): per engine, 32 items of 16 and of 48 tokens
run as sub-passes of 1, 2, 4, 8 and 32 items (the engine's own forward on the cut
features); a sub-pass's fixed cost is what the 32 one-item sub-passes cost beyond the one
32-item pass, over 31, and it is printed in seconds and in tokens' worth.

The served figures (the same texts through ``batchserve serve``) are
``bench/models/served_engines.py``'s.

Run: ``python bench/models/pass_breakdown.py [--threads 1] [--spec minilm:backend=onnx]
[--fixed-cost]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any

from batchserve_testing.arithmetic import Shape, matmul_rate

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.embeddings import builtin_path, load_sentence_transformer
from batchserve.engines.loader import load_model
from batchserve.engines.model import EngineModel
from batchserve.engines.runtime import default_threads
from batchserve.errors import ConfigError
from batchserve.loadgen.texts import reference_paragraphs

BACKENDS = ("torch", "onnx", "onnx-int8", "openvino", "openvino-int8")


def realistic(count: int, seed: int = 0) -> list[str]:
    """``count`` paragraphs of the reference manual, a seeded sample (cycled if too few)."""
    paragraphs = list(reference_paragraphs())
    random.Random(seed).shuffle(paragraphs)
    return [paragraphs[i % len(paragraphs)] for i in range(count)]


def model_shape() -> tuple[int, int, int]:
    """The built-in model's encoder parameters, layers and width (from its torch weights)."""
    st = load_sentence_transformer(builtin_path())
    bert = st[0].auto_model
    params = sum(p.numel() for p in bert.encoder.parameters())
    return params, int(bert.config.num_hidden_layers), int(bert.config.hidden_size)


def useful_flops(lengths: list[int], params: int, layers: int, width: int) -> float:
    """FLOPs of the real tokens (see the module docstring)."""
    return float(sum(2 * params * n + 4 * layers * width * n * n for n in lengths))


def tokenize(fn: Any, batch: list[str]) -> tuple[dict[str, Any], list[int]]:
    """The engine's own tokenization of a pass: features padded to its longest, lengths."""
    if isinstance(fn, EngineModel):
        return fn.features(batch)
    raise TypeError(f"not an engine of the built-in model: {type(fn).__name__}")


def padded_run(fn: Any, requests: list[list[str]]) -> dict[str, float]:
    """Each request as one padded pass: seconds, tokenize seconds, real and computed tokens."""
    tok_s = real = computed = 0.0
    t0 = time.perf_counter()
    for batch in requests:
        t1 = time.perf_counter()
        features, lengths = tokenize(fn, batch)
        tok_s += time.perf_counter() - t1
        fn.forward(features)
        real += sum(lengths)
        computed += len(lengths) * max(lengths)
    return {"s": time.perf_counter() - t0, "tok_s": tok_s, "real": real, "computed": computed}


def cut_run(fn: Any, requests: list[list[str]]) -> dict[str, float]:
    """Each request through the engine's own call (sub-passes); the same figures."""
    before = fn.statistics()
    tok_s = 0.0
    t0 = time.perf_counter()
    for batch in requests:
        fn.embed(batch)
    total = time.perf_counter() - t0
    for batch in requests[:4]:  # tokenize's share, from a few requests
        t1 = time.perf_counter()
        tokenize(fn, batch)
        tok_s += time.perf_counter() - t1
    tok_s *= len(requests) / min(4, len(requests))
    after = fn.statistics()
    return {
        "s": total,
        "tok_s": tok_s,
        "real": after.real_tokens - before.real_tokens,
        "computed": after.computed_tokens - before.computed_tokens,
        "subpasses": (after.subpasses - before.subpasses) / (after.passes - before.passes),
    }


def fixed_cost(fn: Any, spec: str, repeats: int) -> None:
    """Print the sub-pass fixed cost of ``fn`` (see the module docstring)."""
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)
    features, _ = tokenize(fn, [text] * 32)
    for width in (16, 48):
        cut = {
            k: v[:, :width] if getattr(v, "shape", None) is not None and v.ndim == 2 else v
            for k, v in features.items()
        }
        times = {}
        for size in (1, 2, 4, 8, 32):
            parts = [
                {k: v[i : i + size] if hasattr(v, "shape") else v for k, v in cut.items()}
                for i in range(0, 32, size)
            ]
            fn.forward(parts[0])
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                for part in parts:
                    fn.forward(part)
                best = min(best, time.perf_counter() - t0)
            times[size] = best
        fixed = (times[1] - times[32]) / 31
        per_token = times[32] / (32 * width)
        print(
            f"{spec:42} {width:3} tokens: "
            + " ".join(f"{k}:{v * 1e3:.0f}ms" for k, v in times.items())
            + f"  fixed {fixed * 1e3:.2f} ms = {fixed / per_token:.0f} tokens of "
            f"{per_token * 1e6:.0f} us"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec",
        action="append",
        default=[],
        help="a minilm SPEC (repeatable; default: torch, onnx, onnx-int8, openvino, "
        "openvino-int8 at --threads)",
    )
    parser.add_argument("--threads", type=int, default=None, help="default: the server's")
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument("--texts", type=int, default=256, help="texts per repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    parser.add_argument(
        "--fixed-cost", action="store_true", help="measure each engine's sub-pass fixed cost"
    )
    args = parser.parse_args()
    threads = args.threads or default_threads()
    specs = args.spec or [f"minilm:backend={b},threads={threads}" for b in BACKENDS]
    if args.fixed_cost:
        for spec in specs:
            fixed_cost(load_model(spec).fn, spec, max(3, args.repeats))
        return 0
    texts = realistic(args.texts)
    requests = [texts[i : i + args.per_request] for i in range(0, len(texts), args.per_request)]
    params, layers, width = model_shape()
    shape = Shape.of(builtin_path())
    rate = matmul_rate(shape, threads)
    print(
        f"model: {params / 1e6:.2f} M encoder parameters, {layers} layers x {width}; "
        f"matmul 2048x384 @ 384x1536 on {threads} thread(s): {rate:.1f} GFLOP/s; "
        f"{len(texts)} texts, {args.per_request} per request",
        file=sys.stderr,
    )
    if not args.json:
        print(
            f"{'spec':42} {'way':6} {'texts/s':>8} {'computed/real':>13} {'sub/pass':>8} "
            f"{'tokenize':>8} {'GFLOP/s':>8} {'of matmul':>9}"
        )
    for spec in specs:
        try:
            fn: Any = load_model(spec).fn
        except ConfigError as exc:  # e.g. an int8 engine refused by its quality gate
            print(f"{spec}: not loaded: {exc}", file=sys.stderr)
            continue
        fn.embed(requests[0])  # a first pass of each shape, and the cost's warm-up
        fn.embed(requests[-1])
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.repeats):
            for way, run in (("padded", padded_run), ("cut", cut_run)):
                got = run(fn, requests)
                if way not in best or got["s"] < best[way]["s"]:
                    best[way] = got
        rate = max(rate, matmul_rate(shape, threads))
        flops = useful_flops(fn.count_tokens(texts), params, layers, width)
        for way, got in best.items():
            gflops = flops / got["s"] / 1e9
            row = {
                "spec": spec,
                "way": way,
                "threads": threads,
                "texts_per_s": round(len(texts) / got["s"], 1),
                "computed_per_real": round(got["computed"] / got["real"], 3),
                "subpasses_per_pass": round(got.get("subpasses", 1.0), 2),
                "tokenize_share": round(got["tok_s"] / got["s"], 3),
                "useful_gflops": round(gflops, 2),
                "matmul_gflops": round(rate, 2),
                "share_of_matmul": round(gflops / rate, 3),
                "cost": fn.statistics().to_dict()["cost"] if way == "cut" else None,
            }
            if args.json:
                print(json.dumps(row))
                continue
            print(
                f"{spec:42} {way:6} {row['texts_per_s']:8.1f} {row['computed_per_real']:13.3f} "
                f"{row['subpasses_per_pass']:8.2f} {row['tokenize_share'] * 100:7.1f}% "
                f"{gflops:8.2f} {gflops / rate * 100:8.1f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
