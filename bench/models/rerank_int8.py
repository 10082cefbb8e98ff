"""int8 recipes for a MiniLM-L6-sized reranker, in-process: speed, batch invariance, ranking.

What ``auto`` asks of a reranker's engine, measured for recipes it does not offer, beside
the engines it does: the bench builds the cross-encoder ``rerank_throughput.py`` serves
(all-MiniLM-L6-v2's encoder under a random one-label head), exports it into a temporary
cache, makes each recipe from the export, and runs each as batchserve's exported engines
run (its own sub-passes and shape grid) on one thread:

* **pairs/s**: three requests of one query and 100 reference-manual paragraphs, in
  alternating rounds (``--rounds``), the best round;
* **score moves**: each of the quality set's 128 passages (paired with a query) scored
  alone, then in ``--trials`` seeded shuffles into batches of 32 (``auto``'s screen runs
  two): the largest change of a sigmoid score over all of them (the bound: 1e-4);
* **Spearman / top kept**: the ranking gate's figures against torch float32 (16 queries,
  each against the 128 passages).

Recipes: OpenVINO's int8 weights (NNCF ``compress_weights``, symmetric, per channel) with
per-token dynamic activation scales (``DYNAMIC_QUANTIZATION_GROUP_SIZE``), computed in
float32 (its dynamic quantization runs only there; in bfloat16 the weights are only
decompressed), on widths padded to multiples of 16 (OpenVINO handled the last rows of a
sequence short of 16 apart, so a pair's score moved with its padding); NNCF's static int8
(``quantize``, the transformer preset) calibrated on 66 pairs of the shipped queries the
gate does not use, the pooler and classifier kept in floating point, computed with the
rest in bfloat16 and in float32; ONNX Runtime's static QDQ (per-channel weights, MinMax
activations) calibrated on the same pairs.

Run: ``python bench/models/rerank_int8.py [--trials 12] [--rounds 2] [--json]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rerank_throughput import build_folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.export import ensure_exported
from batchserve.engines.model import EngineModel
from batchserve.engines.quality_set import load as load_quality_set
from batchserve.engines.ranking_gate import GATE_QUERIES, gate_sequence
from batchserve.engines.runners import ExportedRunner, open_onnx
from batchserve.engines.runtime import Runtime
from batchserve.engines.sequence import on_exported, on_torch
from batchserve.loadgen.texts import reference_paragraphs
from batchserve.models.kinds import RERANKER
from batchserve.subpasses import GRID, ShapeGrid

#: Widths padded to multiples of 16 (see the module docstring).
GRID16 = ShapeGrid(steps=((1024, 16),), counts=GRID.counts)
#: The head NNCF's static recipe leaves in floating point.
HEAD = ("logits", ".*pooler.*")


def sigmoid(x: Any) -> Any:
    """The reranker's score of a logit."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def calibration_pairs() -> list[tuple[str, str]]:
    """66 pairs: the queries the gate does not use, each with a shipped text of every length."""
    qs = load_quality_set()
    queries = qs.queries[GATE_QUERIES:]
    texts = sorted(qs.texts[::16], key=len)
    return [(queries[i % len(queries)], t) for i, t in enumerate(texts)]


def features(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """A padded batch of pairs as the exported graphs take it."""
    enc = tokenizer(
        [a for a, _ in pairs],
        [b for _, b in pairs],
        padding=True,
        truncation=True,
        max_length=512,
        return_tensors="np",
    )
    return {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}


def build_recipes(folder: Path, cache: Path, out: Path) -> dict[str, Path]:
    """The recipes' files, made from the folder's fp32 exports."""
    import nncf
    import openvino as ov
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    pairs = calibration_pairs()
    batches = [features(tokenizer, pairs[i : i + 8]) for i in range(0, len(pairs), 8)]
    ir = ensure_exported(folder, "openvino", cache).model_file
    onnx_file = ensure_exported(folder, "onnx", cache).model_file
    files = {"w8": out / "w8.xml", "static": out / "static.xml", "qdq": out / "qdq.onnx"}
    quiet = (contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()))
    with quiet[0], quiet[1]:
        core = ov.Core()
        weights = nncf.compress_weights(
            core.read_model(str(ir)), mode=nncf.CompressWeightsMode.INT8_SYM
        )
        ov.save_model(weights, str(files["w8"]), compress_to_fp16=False)
        static = nncf.quantize(
            core.read_model(str(ir)),
            nncf.Dataset(batches),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(batches),
            ignored_scope=nncf.IgnoredScope(patterns=list(HEAD), validate=False),
        )
        ov.save_model(static, str(files["static"]), compress_to_fp16=False)

        class Reader(CalibrationDataReader):  # type: ignore[misc]
            def __init__(self) -> None:
                self.left = iter(batches)

            def get_next(self) -> dict[str, Any] | None:
                return next(self.left, None)

        quantize_static(
            str(onnx_file),
            str(files["qdq"]),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
        )
    return files


def openvino_engine(
    xml: Path, config: dict[str, Any], base: EngineModel, grid: ShapeGrid
) -> EngineModel:
    """``xml`` compiled on one thread with ``config``, run as batchserve runs OpenVINO."""
    import openvino as ov

    compiled = ov.Core().compile_model(
        str(xml), "CPU", {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, **config}
    )
    names = [p.get_any_name() for p in compiled.inputs]
    request = compiled.create_infer_request()

    def run(feeds: dict[str, Any]) -> Any:
        return np.array(request.infer(feeds)[compiled.outputs[0]], copy=True)

    runner = ExportedRunner(run, names, backend="openvino", threads=1, dtype="int8")
    runner.grid = grid
    return EngineModel(runner, base.head)


def engines(folder: Path, cache: Path, files: dict[str, Path]) -> dict[str, Callable[[], Any]]:
    """The contenders, each made when it is measured."""

    def exported(backend: str, dtype: str = "auto") -> Callable[[], Any]:
        runtime = Runtime(backend=backend, dtype=dtype, threads=1, cache_dir=str(cache))
        return lambda: on_exported(folder, runtime)

    def ov(name: str, config: dict[str, Any], grid: ShapeGrid) -> Callable[[], Any]:
        return lambda: openvino_engine(files[name], config, base(), grid)

    def qdq() -> Any:
        run, names = open_onnx(files["qdq"], 1, "int8", 1)
        return EngineModel(
            ExportedRunner(run, names, backend="onnx", threads=1, dtype="int8"), base().head
        )

    def base() -> EngineModel:
        return on_exported(folder, Runtime(backend="openvino", threads=1, cache_dir=str(cache)))

    f32 = {"INFERENCE_PRECISION_HINT": "f32"}
    bf16 = {"INFERENCE_PRECISION_HINT": "bf16"}
    return {
        "torch float32": lambda: on_torch(folder, Runtime(backend="torch", threads=1)),
        "onnx-int8 (dynamic, per pass)": exported("onnx-int8"),
        "openvino bfloat16 (auto's)": exported("openvino", "bfloat16"),
        "openvino int8 weights, per-token scales (group 32)": ov(
            "w8", {**f32, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32}, GRID16
        ),
        "openvino int8 weights, per-token scales (group 384)": ov(
            "w8", {**f32, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 384}, GRID16
        ),
        "openvino static int8 on pairs, rest bfloat16": ov("static", bf16, GRID),
        "openvino static int8 on pairs, rest float32": ov("static", f32, GRID),
        "onnxruntime static QDQ on pairs": qdq,
    }


def rate(fn: Callable[[Any], Any], requests: list[list[tuple[str, str]]], rounds: int) -> float:
    """Pairs a second, the best of ``rounds`` rounds over the requests."""
    best = 0.0
    for _ in range(max(1, rounds)):
        start = time.perf_counter()
        for request in requests:
            fn(request)
        best = max(best, sum(map(len, requests)) / (time.perf_counter() - start))
    return best


def score_moves(fn: Callable[[Any], Any], probes: list[tuple[str, str]], trials: int) -> float:
    """The largest change of a probe's sigmoid score alone and among 31 random mates."""
    alone = sigmoid([fn([p])[0, 0] for p in probes])
    worst = 0.0
    rng = random.Random(0)
    for _ in range(trials):
        order = list(range(len(probes)))
        rng.shuffle(order)
        got = np.zeros(len(probes))
        for i in range(0, len(order), 32):
            idx = order[i : i + 32]
            got[idx] = sigmoid(np.asarray(fn([probes[j] for j in idx]))[:, 0])
        worst = max(worst, float(np.max(np.abs(alone - got))))
    return worst


def main() -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=12, help="shuffles into batches of 32")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (the best counts)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.INFO)
    qs = load_quality_set()
    rng = random.Random(0)
    paragraphs = reference_paragraphs()
    requests = [[(qs.queries[40 + i], p) for p in rng.sample(paragraphs, 100)] for i in range(3)]
    probes = [(qs.queries[i % len(qs.queries)], p) for i, p in enumerate(qs.passages)]
    queries = qs.queries[:GATE_QUERIES]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = build_folder(root / "reranker")
        cache = root / "cache"
        files = build_recipes(folder, cache, root)
        made = {name: make() for name, make in engines(folder, cache, files).items()}
        gate_pairs = [(q, p) for q in queries for p in qs.passages]
        want = made["torch float32"](gate_pairs)
        for fn in made.values():
            fn(requests[0][:8])
        rates = {name: rate(fn, requests, args.rounds) for name, fn in made.items()}
        for name, fn in made.items():
            verdict = gate_sequence(
                lambda _: want, fn, RERANKER, queries=queries, passages=qs.passages, texts=[]
            )
            rows.append(
                {
                    "engine": name,
                    "pairs_per_s": round(rates[name], 1),
                    "score_moves": float(f"{score_moves(fn, probes, args.trials):.2e}"),
                    "spearman": round(float(verdict.spearman_mean or 0.0), 4),
                    "top_kept": verdict.top_kept,
                }
            )
            print(json.dumps(rows[-1]) if args.json else _line(rows[-1]), flush=True)
    return 0


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['engine']:52s} {row['pairs_per_s']:7.1f} pairs/s  score moves "
        f"{row['score_moves']:.1e}  Spearman {row['spearman']:.4f}  top {row['top_kept']:.0%}"
    )


if __name__ == "__main__":
    sys.exit(main())
