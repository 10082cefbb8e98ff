"""LLM rerankers (a causal LM asked yes or no) against the model card's recipe in-process.

The folder is a random-weight ``Qwen3ForCausalLM`` with the ``qwen3`` template
(``batchserve_testing.llm_reranker``); its reference is the card's recipe with transformers, one
pair at a time. Served scores must be within 1e-3 of it, in the same order, whatever the
other pairs of a pass.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")

from batchserve.engines.loader import load_model
from batchserve.errors import ConfigError
from batchserve.models.kinds import RERANKER, folder_kind
from batchserve.models.kinds.llm_template import PRESETS, read_template
from batchserve_testing import llm_reranker

QUERY = "what is a cat"
DOCS = [
    "A cat is a small domesticated carnivorous mammal.",
    "Paris is the capital of France.",
    "Cats sleep for most of the day, and wake up at night to hunt for mice in the barn.",
    "",
    "東京は日本の首都で、とても大きな都市です。",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llm_reranker.build(tmp_path_factory.mktemp("llm"))


@pytest.fixture(scope="module")
def reference(folder: Path) -> llm_reranker.Reference:
    return llm_reranker.Reference(folder)


@pytest.fixture(scope="module")
def served(folder: Path) -> Any:
    return load_model(str(folder))


def _scores(served: Any, pairs: list[tuple[str, str]]) -> np.ndarray[Any, Any]:
    return RERANKER.activate(served.on_engine(pairs)[:, 0])


def test_the_folder_is_a_reranker_with_its_template(folder: Path) -> None:
    found = folder_kind(folder)
    assert found.kind is RERANKER
    assert found.refusal is None
    assert found.template is not None
    assert found.template.prefix == llm_reranker.PREFIX
    assert found.template.suffix == llm_reranker.SUFFIX
    assert found.template.instruction == llm_reranker.INSTRUCTION


def test_scores_equal_the_cards_recipe(served: Any, reference: Any) -> None:
    pairs = [(QUERY, d) for d in DOCS]
    got = _scores(served, pairs)
    want = np.array([reference(q, d) for q, d in pairs])
    assert np.abs(got - want).max() <= 1e-3
    assert list(np.argsort(-got, kind="stable")) == list(np.argsort(-want, kind="stable"))
    assert served.kind is RERANKER
    assert served.engine["backend"] == "torch"  # auto: torch, the only engine gated


def test_the_two_rows_equal_the_whole_vocabulary(folder: Path, served: Any) -> None:
    # The runner multiplies the last hidden state by two rows of the LM head; the full
    # projection's yes - no must be the same logit.
    import torch

    ref = llm_reranker.Reference(folder)
    features, _ = served.on_engine.head.tokenize([(QUERY, DOCS[0]), (QUERY, DOCS[2])])
    with torch.no_grad():
        full = ref.model(
            input_ids=torch.as_tensor(features["input_ids"][:1]),
            attention_mask=torch.as_tensor(features["attention_mask"][:1]),
        ).logits[:, -1]
    want = float(full[0, ref.yes] - full[0, ref.no])
    got = float(served.on_engine([(QUERY, DOCS[0])])[0, 0])
    assert got == pytest.approx(want, abs=1e-4)


def test_a_pair_scores_the_same_alone_and_among_longer_ones(served: Any) -> None:
    short = (QUERY, "cats")
    longer = [(QUERY, d * 6) for d in DOCS if d]
    alone = served.on_engine([short])[0, 0]
    among = served.on_engine([*longer, short, *longer])
    assert abs(among[len(longer), 0] - alone) <= 1e-4
    assert abs(among[-1, 0] - served.on_engine([longer[-1]])[0, 0]) <= 1e-4


def test_long_documents_are_cut_as_the_card_cuts_them(tmp_path: Path) -> None:
    folder = llm_reranker.build(tmp_path, template={"template": "qwen3", "max_length": 96})
    ref = llm_reranker.Reference(folder, max_length=96)
    served: Any = load_model(str(folder))
    long_doc = " ".join(DOCS) * 8
    pairs = [(QUERY, long_doc), (QUERY, DOCS[1])]
    got = _scores(served, pairs)
    assert np.abs(got - [ref(q, d) for q, d in pairs]).max() <= 1e-3
    assert served.on_engine.count_tokens(pairs)[0] == 96
    assert served.max_input_tokens == 96


def test_an_undeclared_causal_lm_is_refused(folder: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "batchserve_reranker.json").unlink()
    with pytest.raises(ConfigError) as caught:
        load_model(str(bare))
    message = str(caught.value)
    assert "a causal language model" in message
    assert "batchserve_reranker.json" in message  # how to declare one


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_an_exported_engine_is_refused(folder: Path, backend: str) -> None:
    with pytest.raises(ConfigError, match=f"torch only.*backend {backend}"):
        load_model(f"{folder}:backend={backend}")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"template": "llama"}, "template"),
        ({"template": "qwen3", "yes": ""}, "yes"),
        ({"template": "qwen3", "no": "yes"}, "yes and no"),
        ({"template": "qwen3", "max_length": 0}, "max_length"),
        ({"template": "qwen3", "max_length": True}, "max_length"),
        ({"template": "qwen3", "prefix": 3}, "prefix"),
        ({"template": "qwen3", "body": "{query} {passage}"}, "body"),
        ({"template": "qwen3", "body": "{query} only"}, "body"),
        ({"template": "qwen3", "suffixx": ""}, "suffixx"),
        ({k: v for k, v in PRESETS["qwen3"].items() if k != "suffix"}, "suffix"),
        ([1, 2], "JSON object"),
    ],
)
def test_a_bad_template_names_its_field(tmp_path: Path, body: Any, field: str) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3ForCausalLM"]}), encoding="utf-8"
    )
    (tmp_path / "batchserve_reranker.json").write_text(json.dumps(body), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"batchserve_reranker\.json") as caught:
        folder_kind(tmp_path)
    assert field in str(caught.value)


def test_an_answer_of_several_tokens_is_refused(folder: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    (other / "batchserve_reranker.json").write_text(
        json.dumps({"template": "qwen3", "yes": "absolutely yes"}), encoding="utf-8"
    )
    with pytest.raises(ConfigError, match=r"yes .*must be one token"):
        load_model(str(other))


def test_a_template_of_its_own_fields_reads_whole(tmp_path: Path) -> None:
    fields = {**PRESETS["qwen3"], "instruction": "Find the answer"}
    (tmp_path / "batchserve_reranker.json").write_text(json.dumps(fields), encoding="utf-8")
    template = read_template(tmp_path)
    assert template is not None
    assert template.format("q", "d") == "<Instruct>: Find the answer\n<Query>: q\n<Document>: d"


def test_a_text_is_not_a_pair(served: Any) -> None:
    with pytest.raises(TypeError, match="input 0 must be a \\(query, document\\) pair"):
        served.on_engine(["just a text"])


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The causal LM saved by sentence-transformers' ``CrossEncoder`` (Transformer, LogitScore),
    its pairs rendered by a chat template of the card's prompt."""
    st = pytest.importorskip("sentence_transformers")
    root = tmp_path_factory.mktemp("llm-st")
    bare = llm_reranker.build(root, name="bare", template=False, chat_template=True)
    st.CrossEncoder(str(bare), device="cpu").save(str(root / "st"))
    return root / "st"


def test_a_cross_encoder_with_logit_score_equals_its_predict(st_folder: Path) -> None:
    from sentence_transformers import CrossEncoder

    found = folder_kind(st_folder)
    assert (found.kind, found.refusal, found.llm, found.template) == (RERANKER, None, True, None)
    served: Any = load_model(str(st_folder))
    assert served.engine["backend"] == "torch"
    pairs = [(QUERY, d) for d in DOCS]
    want = CrossEncoder(str(st_folder), device="cpu").predict(pairs, show_progress_bar=False)
    got = _scores(served, pairs)
    assert np.abs(got - want).max() <= 1e-3
    assert list(np.argsort(-got, kind="stable")) == list(np.argsort(-want, kind="stable"))
    # Its chat template is the card's prompt: the card's recipe gives the same scores.
    card = llm_reranker.Reference(st_folder)
    assert np.abs(got - [card(q, d) for q, d in pairs]).max() <= 1e-3
    short = (QUERY, "cats")
    alone = served.on_engine([short])[0, 0]
    among = served.on_engine([*[(QUERY, d * 6) for d in DOCS if d], short])[-1, 0]
    assert abs(among - alone) <= 1e-4
    with pytest.raises(ConfigError, match="torch only"):
        load_model(f"{st_folder}:backend=onnx")
