"""The CUDA-graph runner without a GPU: buckets, padding, the capture's check, eviction.

A stand-in capture runs the step eagerly on the static buffers at each replay, which is
what a graph's replay computes; the capture and replay of real graphs are
``tests/engines/test_cuda.py``'s (marked gpu).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from batchserve.engines.cuda_graphs import (
    GraphedPasses,
    cosine_within,
    logits_within,
    mask_4d,
)

torch.manual_seed(0)
TABLE = torch.randn(50, 8)


def step(static: dict[str, Any]) -> Any:
    """Mean of the token vectors an item's mask keeps (a pooled 'encoder')."""
    mask = static["attention_mask"].unsqueeze(-1).float()
    vectors = TABLE[static["input_ids"]] * mask
    return vectors.sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def eager(features: dict[str, Any]) -> Any:
    out: np.ndarray[Any, Any] = step(features).numpy()
    return out


class StandIn:
    """Captures by remembering the step; a replay runs it on the static buffers."""

    def __init__(self, fail: bool = False, skew: float = 0.0) -> None:
        self.captures = 0
        self.fail = fail
        self.skew = skew

    def __call__(
        self, step_: Callable[[dict[str, Any]], Any], static: dict[str, Any]
    ) -> tuple[Callable[[], None], Any]:
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        with torch.inference_mode():  # as a capture runs it
            out = step_(static).clone()

        def replay() -> None:
            with torch.inference_mode():
                out.copy_(step_(static) + self.skew)

        return replay, out


def features(lengths: list[int], seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, 50, size=n)
        mask[i, :n] = 1
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "token_type_ids": torch.zeros_like(torch.from_numpy(ids)),
    }


def runner(capture: StandIn, **kw: Any) -> GraphedPasses:
    return GraphedPasses(
        step, eager, device="cpu", check=cosine_within(0.9999), capture=capture, **kw
    )


def test_a_subpass_runs_in_the_smallest_bucket_that_holds_it() -> None:
    graphs = runner(StandIn())
    assert graphs.bucket(3, 20) == (4, 32)
    assert graphs.bucket(1, 16) == (1, 16)
    assert graphs.bucket(33, 130) == (64, 256)
    assert graphs.bucket(129, 16) is None
    assert graphs.bucket(8, 513) is None


def test_the_first_subpass_of_a_bucket_captures_and_the_next_replay_the_eager_rows() -> None:
    capture = StandIn()
    graphs = runner(capture)
    first = features([3, 20, 7], seed=1)
    assert np.allclose(graphs(first), eager(first))
    assert capture.captures == 1
    for seed in (2, 3):
        again = features([5, 17, 9], seed=seed)  # the same bucket (4 x 32)
        got = graphs(again)
        assert got.shape == (3, 8)
        assert np.allclose(got, eager(again), atol=1e-6)
    assert capture.captures == 1
    assert graphs.statistics() == {
        "graphs": 1,
        "captured": 1,
        "replayed": 2,
        "eager": 1,
        "off": None,
    }


def test_a_capture_that_differs_turns_the_graphs_off_and_the_engine_runs_eagerly() -> None:
    graphs = runner(StandIn(skew=0.5))
    first = features([4, 6])
    assert np.allclose(graphs(first), eager(first))  # the eager answer, not the graph's
    assert graphs.off_reason is not None
    assert "differs from the eager one" in graphs.off_reason
    later = features([4, 6], seed=5)
    assert np.allclose(graphs(later), eager(later))
    assert graphs.statistics()["graphs"] == 0


def test_a_capture_that_raises_turns_the_graphs_off() -> None:
    graphs = runner(StandIn(fail=True))
    first = features([2, 9])
    assert np.allclose(graphs(first), eager(first))
    assert graphs.off_reason is not None
    assert "capturing a 2 x 16 pass failed" in graphs.off_reason


def test_a_subpass_past_every_bucket_runs_eagerly_without_a_capture() -> None:
    capture = StandIn()
    graphs = runner(capture, item_buckets=(1, 2), width_buckets=(16,))
    big = features([3, 3, 3])
    assert np.allclose(graphs(big), eager(big))
    assert capture.captures == 0
    assert graphs.statistics()["eager"] == 1


def test_the_least_recently_replayed_graph_is_dropped_past_the_bound() -> None:
    graphs = runner(StandIn(), max_graphs=2)
    for lengths in ([16], [16, 16], [16], [16, 16, 16, 16]):  # buckets (1,16) (2,16) (4,16)
        graphs(features(lengths))
    assert graphs.statistics()["graphs"] == 2
    assert graphs.bucket(1, 16) in graphs._graphs
    assert graphs.bucket(2, 16) not in graphs._graphs


def test_workers_take_turns_and_each_gets_its_own_rows() -> None:
    graphs = runner(StandIn())
    wrong: list[int] = []

    def work(seed: int) -> None:
        for k in range(20):
            f = features([5 + seed % 3, 11, 3 + k % 5], seed=seed * 100 + k)
            if not np.allclose(graphs(f), eager(f), atol=1e-6):
                wrong.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_the_mask_handed_to_the_model_is_four_dimensional_booleans() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    four = mask_4d(mask)
    assert four.shape == (2, 1, 3, 3)
    assert four.dtype == torch.bool
    assert four[0, 0, 2].tolist() == [True, True, False]
    assert four[1, 0, 0].tolist() == [True, False, False]


def test_the_checks_name_what_differs() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    assert cosine_within(0.9999)(a, a) is None
    assert "cosine" in str(cosine_within(0.9999)(a, a[::-1].copy()))
    assert cosine_within(0.9999)(a * np.nan, a) is not None  # NaN never agrees
    assert logits_within(1e-4)(a, a + 5e-5) is None
    assert "moved by" in str(logits_within(1e-4)(a, a + 1e-3))


@pytest.mark.parametrize("rows", [1, 3])
def test_added_rows_never_reach_the_answer(rows: int) -> None:
    # 1 and 3 items run in buckets of 1 and 4: the answer has the sub-pass's rows, each the
    # eager one (the added row's output is dropped, not shifted into place).
    graphs = runner(StandIn())
    graphs(features([7] * rows))
    again = features([7] * rows, seed=9)
    got = graphs(again)
    assert got.shape == (rows, 8)
    assert np.allclose(got, eager(again), atol=1e-6)
    assert graphs.statistics()["replayed"] == 1


def test_the_transformer_step_gives_the_eager_vectors_on_the_cpu() -> None:
    # The step a GPU captures (the transformer, its mask handed 4-D), replayed by the
    # stand-in on the CPU and pooled by the pipeline: the engine's eager vectors, for texts
    # of mixed lengths padded into a bucket wider and taller than the sub-pass.
    from batchserve.engines.corpus import reference_paragraphs
    from batchserve.engines.embeddings import builtin, graph_step
    from batchserve.engines.heads import VectorHead
    from batchserve.engines.runners import TorchRunner
    from batchserve.engines.runtime import Runtime

    fn = builtin(Runtime(backend="torch", device="cpu", threads=1))
    assert isinstance(fn.runner, TorchRunner)
    assert isinstance(fn.head, VectorHead)
    step_ = graph_step(fn.library, fn.head.pipeline)
    assert step_ is not None
    graphs = GraphedPasses(
        step_, fn.runner.eager, device="cpu", check=cosine_within(0.9999), capture=StandIn()
    )
    texts = [*list(reference_paragraphs())[:5], "Hi", " spaces around "]
    features, _ = fn.features(texts)
    for _ in range(2):  # a capture, then a replay
        got = fn.head.pipeline.pool(graphs(dict(features)), features)
    assert graphs.statistics()["off"] is None
    want = fn(texts)
    cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert float(cos.min()) >= 0.9999
    shaped = fn.head.shaped(4, 32)
    assert shaped["input_ids"].shape == shaped["attention_mask"].shape == (4, 32)


def test_the_sequence_step_gives_the_eager_logits_on_the_cpu(reranker_folder: Any) -> None:
    from batchserve.engines import sequence
    from batchserve.engines.runners import TorchRunner
    from batchserve.engines.runtime import Runtime

    fn = sequence.on_torch(reranker_folder, Runtime(backend="torch", device="cpu"))
    assert isinstance(fn.runner, TorchRunner)
    graphs = GraphedPasses(
        sequence.graph_step(fn.runner.model),
        fn.runner.eager,
        device="cpu",
        check=logits_within(1e-4),
        capture=StandIn(),
    )
    enc = fn.tokenizer(
        ["how to read a file"] * 3,
        ["open() returns a file object", "a long passage " * 20, "no"],
        padding=True,
        truncation=True,
        return_tensors="pt",
    )
    want = fn.runner.eager(dict(enc))
    for _ in range(2):
        got = graphs(dict(enc))
    assert graphs.statistics()["off"] is None
    assert np.max(np.abs(got - want)) <= 1e-4


def test_warming_captures_every_bucket_the_window_may_use_and_no_more() -> None:
    capture = StandIn()
    graphs = runner(capture)
    assert graphs.warm(lambda n, width: features([width] * n), window=40) == 8 * 3
    assert capture.captures == 24  # widths 16, 32 and 64 (which holds 40), 8 item counts
    f = features([40, 33])
    assert np.allclose(graphs(f), eager(f), atol=1e-6)
    assert capture.captures == 24  # a replay, no capture under traffic
