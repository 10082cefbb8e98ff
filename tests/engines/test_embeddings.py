"""The MiniLM adapter: batching never changes an embedding; thread safety; token counts.

The property: an embedding computed in a batch of texts of other lengths equals the one
``SentenceTransformer.encode`` computes for the text alone, to cosine >= 0.9999. The model
loads once for this module (~10 s).
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from batchserve.engines.embeddings import EXTRA_HINT, builtin
from batchserve.engines.loader import load_model
from batchserve.engines.model import EngineModel

MIXED = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "Dynamic batching groups requests that arrive close together into one forward pass, "
    "so the padding of the short ones must never leak into their results.",
    "ünïcödé and emoji ✓ 🚀 mixed in",
    " ".join(["a very long text that will be truncated at the model's maximum length"] * 40),
    "x",
    "Two sentences. The second one is here.",
]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def embedder() -> EngineModel:
    pytest.importorskip("sentence_transformers")
    return builtin()


@pytest.mark.slow
def test_a_batch_of_mixed_lengths_equals_each_text_alone(embedder: EngineModel) -> None:
    st = embedder.library
    alone = [np.asarray(st.encode(t), dtype=np.float32) for t in MIXED]
    for order in (MIXED, MIXED[::-1], MIXED[2:] + MIXED[:2]):
        batch = embedder(order)
        assert batch.shape == (len(order), embedder.dimension)
        assert batch.dtype == np.float32
        for row, text in zip(batch, order, strict=True):
            assert cosine(row, alone[MIXED.index(text)]) >= 0.9999, text
            assert abs(np.linalg.norm(row) - 1.0) < 1e-5


@pytest.mark.slow
def test_token_counts_match_the_tokenizer(embedder: EngineModel) -> None:
    _, counts = embedder.embed(MIXED)
    tok = embedder.library.tokenizer
    expected = [
        len(tok(t, truncation=True, max_length=embedder.max_seq_length)["input_ids"]) for t in MIXED
    ]
    assert counts == expected
    assert counts[4] == embedder.max_seq_length  # the long one is truncated
    assert embedder.count_tokens(MIXED) == expected  # remembered from the pass
    assert embedder.count_tokens(["never embedded before"]) == [
        len(tok("never embedded before")["input_ids"])
    ]


@pytest.mark.slow
def test_two_threads_at_once_get_the_serial_answers(embedder: EngineModel) -> None:
    a = [f"thread A text {i} " * (i + 1) for i in range(8)]
    b = [f"thread B sentence number {i}" for i in range(8)]
    serial = {id(a): embedder(a), id(b): embedder(b)}
    results: dict[int, list[np.ndarray]] = {id(a): [], id(b): []}
    errors: list[BaseException] = []

    def work(texts: list[str]) -> None:
        try:
            for _ in range(5):
                results[id(texts)].append(embedder(texts))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    for key, outs in results.items():
        assert len(outs) == 5
        for out in outs:
            assert np.allclose(out, serial[key], atol=1e-5)


@pytest.mark.slow
def test_a_non_string_input_raises_type_error(embedder: EngineModel) -> None:
    with pytest.raises(TypeError, match="input 1 must be a string"):
        embedder(["ok", 3])
    assert embedder([]).shape == (0, embedder.dimension)


def test_without_the_extra_one_sentence_names_the_pip_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ImportError) as info:
        load_model("minilm")
    assert str(info.value) == EXTRA_HINT
    assert "pip install 'batchserve[embeddings]'" in str(info.value)
