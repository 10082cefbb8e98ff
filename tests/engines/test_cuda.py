"""The engines on a CUDA GPU: batch invariance, rerank and classify, ``auto``'s choice.

Marked ``gpu`` and skipped, saying so, where torch sees no CUDA device: ``bench/gpu/run.sh``
runs them on a machine with one. The served vectors at each precision, and a drain under
load, are ``tests/server/test_served_on_cuda.py``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchserve.engines.corpus import reference_paragraphs
from batchserve.engines.quality import MIN_INVARIANCE, invariance
from support import NO_CUDA, cuda_here

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_here(), reason=NO_CUDA)]

HALF = ("float16", "bfloat16")


def _texts(n: int = 96) -> list[str]:
    paragraphs = list(reference_paragraphs())
    step = max(1, len(paragraphs) // n)
    return paragraphs[::step][:n]


@pytest.mark.parametrize("dtype", ["float32", *HALF])
def test_a_vector_does_not_depend_on_its_batch_mates_on_cuda(dtype: str) -> None:
    from batchserve.engines import embeddings
    from batchserve.engines.runtime import Runtime

    fn = embeddings.builtin(Runtime(backend="torch", device="cuda", dtype=dtype))
    assert fn.device.startswith("cuda")
    worst, probes = invariance(fn, _texts(), probes=64, batch_size=32)
    assert probes == 64
    # The gate's own bound: auto refuses an engine below it (dynamic int8 on the CPU).
    assert worst >= MIN_INVARIANCE, f"{dtype}: {worst}"


def _scores(fn: Any, items: list[Any]) -> Any:
    return np.asarray(fn(items), dtype=np.float64)


@pytest.mark.parametrize("folder", ["reranker_folder", "classifier_folder"])
def test_rerank_and_classify_on_cuda_give_the_cpus_scores(
    folder: str, request: pytest.FixtureRequest
) -> None:
    from batchserve.engines import sequence
    from batchserve.engines.ranking_gate import score_similarity
    from batchserve.engines.runtime import Runtime
    from batchserve.models.kinds import RERANKER

    path: Path = request.getfixturevalue(folder)
    cpu = sequence.on_torch(path, Runtime(backend="torch", device="cpu", threads=1))
    gpu = sequence.on_torch(path, Runtime(backend="torch", device="cuda"))
    assert gpu.device.startswith("cuda")
    texts = _texts(64)
    items: list[Any] = (
        [("how do I read a file", t) for t in texts] if gpu.kind is RERANKER else texts
    )
    want, got = _scores(cpu, items), _scores(gpu, items)
    # float32 on both (TF32 is off for matrix products by default): the same logits.
    assert np.max(np.abs(want - got)) <= 1e-4
    if gpu.kind is RERANKER:
        assert list(np.argsort(-want[:, 0], kind="stable")) == list(
            np.argsort(-got[:, 0], kind="stable")
        )
    else:
        assert list(want.argmax(axis=1)) == list(got.argmax(axis=1))
    worst, _ = invariance(
        gpu, items, probes=32, batch_size=16, similarity=score_similarity(gpu.kind)
    )
    assert worst >= MIN_INVARIANCE


def test_auto_on_cuda_times_torch_at_each_precision_and_serves_a_gated_one(
    tmp_path: Path, engine_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from batchserve.engines.embeddings import builtin_path
    from batchserve.engines.hardware import REFERENCE
    from batchserve.engines.loader import choose_engine
    from batchserve.engines.runtime import Runtime

    monkeypatch.setenv("BATCHSERVE_QUALITY_SET", engine_env["BATCHSERVE_QUALITY_SET"])
    fn, verdict = choose_engine(builtin_path(), Runtime(device="auto", cache_dir=str(tmp_path)))
    assert verdict.device == "cuda:0"
    assert fn.device == "cuda:0"
    assert verdict.cpu_share is None  # timed on a GPU: the CPU's share says nothing
    by_engine = {str(t.engine): t for t in verdict.trials}
    for dtype in ("float32", "float16", "bfloat16", "float16-mixed", "bfloat16-mixed"):
        trial = by_engine[f"torch/{dtype}"]
        assert trial.items_per_s is not None, trial
        assert trial.items_per_s > 0, trial
    for name, trial in by_engine.items():
        if not name.startswith("torch/"):
            assert trial.unavailable is not None
            assert "not on cuda:0" in trial.unavailable or "not installed" in trial.unavailable
    chosen = verdict.trial(verdict.chosen)
    assert chosen is not None
    assert chosen.gated, verdict.table()
    reference_rate = by_engine["torch/float32"].items_per_s
    assert chosen.items_per_s is not None
    assert reference_rate is not None
    assert verdict.chosen == REFERENCE or chosen.items_per_s > reference_rate
    assert fn.dtype == verdict.chosen.dtype
    # The second start reads the verdict back instead of measuring again.
    _, again = choose_engine(builtin_path(), Runtime(device="auto", cache_dir=str(tmp_path)))
    assert again.cached
    assert again.chosen == verdict.chosen


@pytest.mark.parametrize("dtype", ["float32", *HALF])
def test_cuda_graphs_give_the_eager_vectors(dtype: str) -> None:
    from batchserve.engines import embeddings
    from batchserve.engines.runtime import Runtime

    graphed = embeddings.builtin(
        Runtime(backend="torch", device="cuda", dtype=dtype, cuda_graphs=True)
    )
    eager = embeddings.builtin(Runtime(backend="torch", device="cuda", dtype=dtype))
    assert graphed.graphs is not None
    assert eager.graphs is None
    texts = _texts(96)
    bound = 0.9999 if dtype == "float32" else 0.999
    for size in (1, 7, 32, 96):  # several buckets, each twice: a capture, then replays
        want = np.asarray(eager(texts[:size]), dtype=np.float64)
        for _ in range(2):
            got = np.asarray(graphed(texts[:size]), dtype=np.float64)
            cos = np.sum(got * want, axis=1) / (
                np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
            )
            assert float(cos.min()) >= bound, (size, float(cos.min()))
    stats = graphed.graphs.statistics()
    assert stats["off"] is None, stats
    assert stats["captured"] == stats["graphs"] == 8 * 5  # every bucket, at load
    assert stats["replayed"] >= 8


def test_cuda_graphs_give_the_eager_rerank_logits(reranker_folder: Path) -> None:
    from batchserve.engines import sequence
    from batchserve.engines.runtime import Runtime

    graphed = sequence.on_torch(
        reranker_folder, Runtime(backend="torch", device="cuda", cuda_graphs=True)
    )
    eager = sequence.on_torch(reranker_folder, Runtime(backend="torch", device="cuda"))
    assert graphed.graphs is not None
    items = [("how do I read a file", t) for t in _texts(40)]
    want = _scores(eager, items)
    for _ in range(2):
        assert np.max(np.abs(_scores(graphed, items) - want)) <= 1e-4
    assert graphed.graphs.statistics()["off"] is None
