"""Rerankers and classifiers: the kind read from a folder, and the torch engine's passes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchserve.engines.embeddings import builtin_path
from batchserve.engines.loader import load_model
from batchserve.engines.model import EngineModel
from batchserve.engines.ranking_gate import gate_sequence, spearman
from batchserve.engines.runners import TorchRunner
from batchserve.engines.runtime import Runtime
from batchserve.engines.sequence import max_sequence_length, on_torch
from batchserve.errors import ConfigError
from batchserve.models.kinds import CLASSIFIER, EMBEDDING, RERANKER, folder_kind, wrong_kind

pytest.importorskip("transformers")


def test_the_kind_comes_from_the_folder(reranker_folder: Path, classifier_folder: Path) -> None:
    assert folder_kind(reranker_folder).kind is RERANKER
    assert folder_kind(reranker_folder).labels == ("LABEL_0",)
    found = folder_kind(classifier_folder)
    assert found.kind is CLASSIFIER
    assert found.labels == ("negative", "neutral", "positive")
    assert found.architecture == "BertForSequenceClassification"
    assert folder_kind(builtin_path()).kind is EMBEDDING


def test_a_folder_without_labels_counts_num_labels(tmp_path: Path) -> None:
    config = {"architectures": ["XForSequenceClassification"], "num_labels": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert folder_kind(tmp_path).labels == ("LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3")
    config = {"architectures": ["XForSequenceClassification"], "id2label": {"0": "a", "2": "b"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"0\.\.N-1"):
        folder_kind(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(ConfigError, match="JSON object"):
        folder_kind(tmp_path)


def test_wrong_kind_names_the_kind_and_the_route() -> None:
    message = wrong_kind("ce", RERANKER, "POST /v1/embeddings")
    assert message == (
        "model 'ce' is a reranker model and does not answer POST /v1/embeddings; use POST /rerank"
    )


def test_the_window_is_what_the_folder_states_bounded_by_positions(tmp_path: Path) -> None:
    assert max_sequence_length(tmp_path, 10**30, 512) == 512
    assert max_sequence_length(tmp_path, 128, 512) == 128
    assert max_sequence_length(tmp_path, 4096, 512) == 512
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 64}')
    assert max_sequence_length(tmp_path, 512, 512) == 64


def test_a_reranker_scores_pairs_as_the_model_does_alone(reranker_folder: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    engine = on_torch(reranker_folder, Runtime(backend="torch", threads=1))
    assert engine.kind is RERANKER
    assert engine.num_labels == 1
    pairs = [
        ("what is a cat", "A cat is a small domesticated carnivorous mammal."),
        ("what is a cat", "Paris is the capital of France."),
        ("q", "word " * 600),  # over the window: truncated, not refused
    ]
    scores = engine(pairs)
    assert scores.shape == (3, 1)
    assert scores.dtype == np.float32
    tok = AutoTokenizer.from_pretrained(str(reranker_folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(reranker_folder)).eval()
    for pair, got in zip(pairs, scores, strict=True):
        enc = tok(*pair, truncation=True, max_length=512, return_tensors="pt")
        with torch.inference_mode():
            want = model(**enc).logits[0].numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
    # Batch invariance: the same pair alone and among others.
    alone = engine([pairs[1]])
    np.testing.assert_allclose(alone[0], scores[1], atol=1e-5)
    counts = engine.measure(pairs)
    assert counts[2] == (512, True)
    assert counts[0][1] is False
    assert engine.measure([("fresh query", "word " * 600)]) == [(512, True)]


def test_a_classifier_answers_one_logit_per_label(classifier_folder: Path) -> None:
    engine = on_torch(classifier_folder, Runtime(backend="torch", threads=1))
    assert engine.kind is CLASSIFIER
    assert engine.labels == ("negative", "neutral", "positive")
    out = engine(["I love it", ("premise", "hypothesis"), "I hate it"])
    assert out.shape == (3, 3)
    np.testing.assert_allclose(engine(["I hate it"])[0], out[2], atol=1e-5)
    with pytest.raises(TypeError, match="input 0 must be a string or a pair"):
        engine([3])


def test_load_model_serves_a_folder_by_its_kind(
    reranker_folder: Path, classifier_folder: Path
) -> None:
    loaded = load_model(f"{reranker_folder}:backend=torch,threads=1")
    assert loaded.kind is RERANKER
    assert loaded.labels == ("LABEL_0",)
    assert loaded.max_input_tokens == 512
    assert loaded.engine is not None
    assert loaded.engine["backend"] == "torch"
    assert load_model(f"{classifier_folder}:backend=torch").kind is CLASSIFIER
    with pytest.raises(ConfigError, match="openvino-int8 is not offered for rerankers"):
        load_model(f"{reranker_folder}:backend=openvino-int8,cache_dir={reranker_folder}-cache")


def test_auto_measures_a_rerankers_engines_gates_them_and_caches_the_choice(
    reranker_folder: Path, tmp_path: Path
) -> None:
    spec = f"{reranker_folder}:threads=1,cache_dir={tmp_path}"
    loaded = load_model(spec)
    assert loaded.kind is RERANKER
    assert loaded.engine is not None
    choice = loaded.engine["choice"]
    assert choice["kind"] == "reranker"
    assert not choice["cached"]
    chosen = choice["chosen"]
    assert (loaded.engine["backend"], loaded.engine["precision"]) == (
        chosen["backend"],
        chosen["precision"],
    )
    trials = {f"{t['backend']}/{t['precision']}": t for t in choice["trials"]}
    assert trials["torch/float32"]["items_per_s"] > 0
    served = trials[f"{chosen['backend']}/{chosen['precision']}"]
    assert served["gated"] is True
    if chosen["backend"] != "torch" or chosen["precision"] != "float32":
        # an engine other than the reference was gated on the ranking it keeps
        assert served["quality"]["kind"] == "reranker"
        assert served["quality"]["spearman_mean"] >= 0.99
        assert served["invariance"] >= 0.9999
    again = load_model(spec)
    assert again.engine is not None
    assert again.engine["choice"]["cached"]
    assert again.engine["choice"]["chosen"] == chosen
    assert isinstance(again.fn, EngineModel)
    assert again.fn([("q", "a passage"), ("q", "another one")]).shape == (2, 1)


def test_a_pass_runs_as_length_sorted_sub_passes(reranker_folder: Path) -> None:
    engine = on_torch(reranker_folder, Runtime(backend="torch", threads=1))
    runner = engine.runner
    assert isinstance(runner, TorchRunner)
    model = runner.model
    shapes: list[tuple[int, int]] = []

    class Recording:
        device = model.device

        def __call__(self, **features: Any) -> Any:
            shapes.append(tuple(features["input_ids"].shape))
            return model(**features)

    pairs = [("q", "short")] * 6 + [("q", "word " * 300)] * 2 + [("q", "a b c")] * 6
    whole = engine(pairs)
    runner.model = Recording()
    shapes.clear()
    split = engine(pairs)
    np.testing.assert_allclose(split, whole, atol=1e-5)
    # The two long pairs run apart from the twelve short ones (answers in the original order).
    assert len(shapes) >= 2
    assert any(length >= 300 and n == 2 for n, length in shapes)
    assert sum(n * length for n, length in shapes) < 14 * 305 / 3


def test_spearman_and_the_gate_s_thresholds_with_plain_numbers() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert spearman([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(0.8)

    def ref(items: Sequence[Any]) -> Any:
        return np.asarray([[float(len(p))] for _, p in items], dtype=np.float32)

    def swapped(items: Sequence[Any]) -> Any:  # the two longest passages change places
        out = ref(items)
        return np.where(out == 5.0, 4.0, np.where(out == 4.0, 5.0, out))

    passages = ["a", "bb", "ccc", "dddd", "eeeee"]
    same = gate_sequence(ref, ref, RERANKER, queries=["q"], passages=passages, texts=[])
    assert same.passed
    assert same.spearman_mean == 1.0
    moved = gate_sequence(ref, swapped, RERANKER, queries=["q"], passages=passages, texts=[])
    assert not moved.passed
    assert moved.top_kept == 0.0
    assert "FAIL" in moved.summary()

    def labels(texts: Sequence[Any]) -> Any:
        return np.asarray([[len(t) % 2, 1 - len(t) % 2] for t in texts], dtype=np.float32)

    texts = ["a", "bb", "ccc"]
    assert gate_sequence(labels, labels, CLASSIFIER, queries=[], passages=[], texts=texts).passed


def test_at_float32_every_score_stays_within_1e4_and_every_order_is_kept() -> None:
    passages = ["a", "bb", "ccc", "dddd", "eeeee"]

    def ref(items: Sequence[Any]) -> Any:
        return np.asarray([[float(len(p)) / 10] for _, p in items], dtype=np.float32)

    def nudged(by: float, *, swap: bool = False) -> Any:
        def scores(items: Sequence[Any]) -> Any:
            out = ref(items) + by
            if swap:  # the two longest passages' scores exchanged
                out = np.where(np.isclose(out, 0.5 + by), 0.4 + by, np.where(
                    np.isclose(out, 0.4 + by), 0.5 + by, out))  # fmt: skip
            return out

        return scores

    def judge(candidate: Any, dtype: str) -> Any:
        return gate_sequence(ref, candidate, RERANKER, queries=["q", "r"], passages=passages,
                             texts=[], dtype=dtype)  # fmt: skip

    assert judge(nudged(1e-5), "float32").passed  # 2.5e-6 after the sigmoid
    moved = judge(nudged(1e-3), "float32")  # the same order, a score 2.4e-4 off
    assert (moved.passed, moved.failed_bounds(), moved.floor) == (False, ["score"], 1e-4)
    assert "max score diff 2.4" in moved.summary()
    assert judge(nudged(1e-3), "bfloat16").passed  # within half precision's 1e-2
    assert judge(nudged(1e-3), "int8").passed  # int8: the rates alone
    # one query's two best passages swapped: every rate but the order and score pass int8
    swapped = judge(nudged(0.0, swap=True), "float32")
    assert swapped.order_kept == 0.0
    assert "order" in swapped.failed_bounds()


def test_at_float32_every_label_is_kept_but_for_ties() -> None:
    texts = [f"text {i}" for i in range(100)]
    decisive = np.tile(np.asarray([[1.0, 0.0]], dtype=np.float32), (100, 1))

    def ref(items: Sequence[Any]) -> Any:  # the last text is a tie between its two labels
        out = decisive.copy()
        out[-1] = [0.5, 0.5]
        return out

    def flips_the_tie(items: Sequence[Any]) -> Any:
        out = ref(items)
        out[-1, 1] += 1e-6
        return out

    def flips_one(items: Sequence[Any]) -> Any:
        out = ref(items)
        out[0] = [0.0, 1.0]
        return out

    kept = gate_sequence(ref, flips_the_tie, CLASSIFIER, queries=[], passages=[],
                         texts=texts, dtype="float32")  # fmt: skip
    assert (kept.passed, kept.order_kept, kept.label_kept) == (True, 1.0, 0.99)
    lost = gate_sequence(ref, flips_one, CLASSIFIER, queries=[], passages=[],
                         texts=texts, dtype="float32")  # fmt: skip
    assert not lost.passed  # 99% kept passes the rate, but one decisive label moved
    assert lost.failed_bounds() == ["score", "order"]
    assert lost.order_kept == 0.99
