"""A pass as length-sorted sub-passes: cut, run, answered in order, its cost learned.

The runner is tested with a fake forward on numpy features and a manual clock (every
figure exact), then on the real engines (torch, ONNX Runtime fp32): a pass cut into
sub-passes answers what the same pass run whole answers, in order.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from batchserve.engines.passes import (
    CPU_PRIOR,
    GPU_PRIOR,
    MIN_FIXED_TOKENS,
    WARMUP,
    SubPasses,
    prior,
)
from batchserve.subpasses import PassCost, ShapeGrid


def padded(lengths: list[int], *, left: bool = False) -> dict[str, Any]:
    """Features of a pass padded to its longest: token ``j`` of item ``i`` is ``1000 i + j``."""
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        cols = slice(width - n, width) if left else slice(0, n)
        ids[i, cols] = 1000 * i + np.arange(1, n + 1)
        mask[i, cols] = 1
    return {"input_ids": ids, "attention_mask": mask, "modality": "text"}


class Recorder:
    """A forward that answers (first id, last real id, width) per row and records shapes."""

    def __init__(self, clock: list[float] | None = None, cost: PassCost | None = None) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.clock = clock
        self.cost = cost

    def __call__(self, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        ids, mask = features["input_ids"], features["attention_mask"]
        assert features["modality"] == "text"  # values of another shape pass through
        n, width = ids.shape
        self.shapes.append((n, width))
        if self.clock is not None and self.cost is not None:
            self.clock[0] += self.cost.seconds(n, width)
        real = np.where(mask == 1, ids, 0)
        return np.stack(
            [real.max(axis=1) // 1000, real.max(axis=1) % 1000, np.full(n, width)], axis=1
        ).astype(np.float32)


def test_a_long_passage_is_cut_from_the_short_texts_and_answers_stay_in_order() -> None:
    lengths = [3, 86, 7, 3, 5]
    runner = SubPasses(prior("cpu"))
    forward = Recorder()
    out = runner.run(padded(lengths), lengths, forward)
    # Row i answers item i, with all its tokens, whatever sub-pass it ran in.
    assert out[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert out[:, 1].tolist() == lengths
    assert sorted(forward.shapes) == [(1, 86), (4, 7)]
    stats = runner.statistics()
    assert (stats.passes, stats.subpasses) == (1, 2)
    assert stats.real_tokens == sum(lengths)
    assert stats.computed_tokens == 4 * 7 + 86
    assert stats.unsplit_tokens == 5 * 86
    assert stats.waste == pytest.approx((4 * 7 + 86) / sum(lengths))
    assert stats.to_dict()["subpasses"] == 2


def test_equal_lengths_run_whole_and_uncut() -> None:
    runner = SubPasses(prior("cpu"))
    forward = Recorder()
    out = runner.run(padded([9, 9, 9]), [9, 9, 9], forward)
    assert forward.shapes == [(3, 9)]
    assert out[:, 0].tolist() == [0, 1, 2]


def test_padding_beyond_the_longest_is_cut_even_in_one_subpass() -> None:
    features = padded([4, 4, 12])
    runner = SubPasses(GPU_PRIOR)
    forward = Recorder()
    runner.run(features, [4, 4, 4], forward)  # the pass was padded wider than its items
    assert forward.shapes == [(3, 4)]


def test_a_left_padded_pass_is_cut_from_the_left() -> None:
    lengths = [2, 60, 3]
    runner = SubPasses(prior("cpu"), left_padded=True)
    forward = Recorder()
    out = runner.run(padded(lengths, left=True), lengths, forward)
    assert out[:, 1].tolist() == lengths
    assert sorted(forward.shapes) == [(1, 60), (2, 3)]


def test_bounds_cap_a_subpass() -> None:
    runner = SubPasses(GPU_PRIOR, max_items=4)
    forward = Recorder()
    runner.run(padded([10] * 10), [10] * 10, forward)
    assert sorted(n for n, _ in forward.shapes) == [2, 4, 4]
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        SubPasses(GPU_PRIOR, max_tokens=0)
    with pytest.raises(ValueError, match="at least one item"):
        runner.run(padded([1]), [], forward)


def test_on_a_grid_subpasses_run_at_grid_shapes_padded_with_the_pad_token() -> None:
    grid = ShapeGrid(steps=((8, 4), (64, 16)), counts=(1, 2, 4))
    lengths = [3, 9, 7, 3, 5, 30, 6]
    runner = SubPasses(prior("cpu"), grid=grid, window=40, pad_id=77)
    seen: list[dict[str, Any]] = []

    def forward(features: dict[str, Any]) -> npt.NDArray[np.float32]:
        seen.append(features)
        return Recorder()(features)

    out = runner.run(padded(lengths), lengths, forward)
    assert out[:, 0].tolist() == list(range(len(lengths)))
    assert out[:, 1].tolist() == lengths  # every item kept all its tokens, no more
    shapes = [f["input_ids"].shape for f in seen]
    assert all(n in grid.counts and w == grid.width(w, 40) for n, w in shapes), shapes
    assert any(w > 30 for _, w in shapes)  # 30 -> 32: past the pass's own padding
    for f in seen:  # added columns are the pad token, hidden by the mask
        ids, mask = f["input_ids"], f["attention_mask"]
        assert np.all(ids[mask == 0] % 77 == 0)
        assert (ids.dtype, mask.dtype) == (np.int64, np.int64)
    stats = runner.statistics()
    assert stats.shapes == len(set(shapes))
    assert stats.computed_tokens == sum(n * w for n, w in shapes)
    assert SubPasses(prior("cpu")).statistics().shapes is None


def test_a_left_padded_model_gets_no_grid() -> None:
    with pytest.raises(ValueError, match="left-padded"):
        SubPasses(prior("cpu"), grid=ShapeGrid(steps=((8, 4),), counts=(1,)), left_padded=True)


def test_the_gpu_prior_keeps_a_mixed_pass_whole_and_the_cpu_prior_cuts_it() -> None:
    lengths = [12, 14, 17, 19, 21, 22, 24, 26, 28, 30, 31, 33, 35, 36, 38, 40]
    lengths += [43, 45, 48, 51, 55, 60, 66, 72, 80, 90, 98, 110, 128, 160, 200, 256]
    cpu, gpu = SubPasses(prior("cpu", 1)), SubPasses(prior("cuda:0"))
    assert len(gpu.plan(lengths)) < len(cpu.plan(lengths))
    assert len(gpu.plan(lengths)) <= 3
    cut = cpu.plan(lengths)
    computed = sum(len(g) * max(lengths[i] for i in g) for g in cut)
    assert computed / sum(lengths) <= 1.15
    # More threads divide the per-token cost, not the fixed one.
    two = prior("cpu", 2)
    assert two.fixed_s == CPU_PRIOR.fixed_s
    assert two.per_token_s == pytest.approx(CPU_PRIOR.per_token_s / 2)


def test_the_cost_is_learned_from_timed_subpasses() -> None:
    true = PassCost(fixed_s=0.004, per_token_s=150e-6, attention_s=0.3e-6)
    clock = [0.0]
    runner = SubPasses(prior("cuda:0"), clock=lambda: clock[0])
    forward = Recorder(clock, true)
    rng = np.random.default_rng(0)
    assert runner.cost == GPU_PRIOR
    for _ in range(40):
        lengths = [int(x) for x in rng.integers(4, 200, size=int(rng.integers(1, 24)))]
        runner.run(padded(lengths), lengths, forward)
    stats = runner.statistics()
    assert stats.observed >= WARMUP
    assert stats.cost.fixed_s == pytest.approx(true.fixed_s, rel=1e-3)
    assert stats.cost.per_token_s == pytest.approx(true.per_token_s, rel=1e-3)
    assert stats.cost.attention_s == pytest.approx(true.attention_s, rel=1e-3)
    # Having learned a CPU's cost, it now cuts where the GPU prior kept passes whole.
    assert len(runner.plan([9, 250, 11, 10, 12, 8])) == 2


def test_a_fixed_cost_read_as_zero_still_keeps_close_lengths_together() -> None:
    clock = [0.0]
    runner = SubPasses(prior("cpu"), clock=lambda: clock[0])
    forward = Recorder(clock, PassCost(fixed_s=0.0, per_token_s=100e-6))
    for width in range(20, 20 + WARMUP + 4):
        runner.run(padded([width, width]), [width, width], forward)
    assert runner.cost.fixed_s == pytest.approx(0.0, abs=1e-9)
    # Eight items of eight lengths in a row: without the floor, each alone.
    lengths = [30, 31, 32, 33, 34, 35, 36, 37]
    assert MIN_FIXED_TOKENS >= 8
    assert len(runner.plan(lengths)) <= 2


def test_passes_in_several_threads_count_every_subpass() -> None:
    runner = SubPasses(prior("cpu"))
    lengths = [3, 90, 4, 5]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(25):
                out = runner.run(padded(lengths), lengths, Recorder())
                assert out[:, 1].tolist() == lengths
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    stats = runner.statistics()
    assert stats.passes == 100
    assert stats.observed == stats.subpasses >= 100


#: Short texts and two long ones: a plan on a CPU cuts the long ones off.
TEXTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    " ".join(["A paragraph of the reference manual, long enough to be cut from the rest."] * 6),
    "x",
    "Dynamic batching groups requests.",
    " ".join(["a very long text that will be truncated at the model's maximum length"] * 40),
    "Two sentences. The second one is here.",
]


def check_cut_pass_equals_whole(engine: Any, whole: npt.NDArray[np.float32]) -> None:
    before = engine.statistics()
    got, counts = engine.embed(TEXTS)
    after = engine.statistics()
    assert after.passes == before.passes + 1
    assert after.subpasses - before.subpasses >= 2  # it really cut
    assert after.real_tokens - before.real_tokens == sum(counts)
    assert after.computed_tokens - before.computed_tokens < len(TEXTS) * max(counts)
    assert got.shape == whole.shape
    cos = np.sum(got * whole, axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(whole, axis=1)
    )
    assert np.all(cos >= 0.9999), cos
    assert engine.count_tokens(TEXTS) == counts


@pytest.mark.slow
def test_torch_answers_a_cut_pass_as_the_whole_pass() -> None:
    pytest.importorskip("sentence_transformers")
    from batchserve.engines.embeddings import builtin
    from batchserve.engines.runtime import Runtime

    engine = builtin(Runtime(device="cpu"))
    whole = engine.forward(engine.features(list(TEXTS))[0])
    check_cut_pass_equals_whole(engine, whole)


@pytest.mark.slow
def test_onnx_fp32_answers_a_cut_pass_as_the_whole_pass(engine_cache: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from batchserve.engines.loader import load_model
    from batchserve.engines.model import EngineModel
    from batchserve.engines.runners import ExportedRunner

    engine = load_model(f"minilm:backend=onnx,cache_dir={engine_cache}").fn
    assert isinstance(engine, EngineModel)
    assert isinstance(engine.runner, ExportedRunner)
    whole = engine.forward(engine.features(list(TEXTS))[0])
    check_cut_pass_equals_whole(engine, whole)
