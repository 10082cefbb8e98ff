"""What a folder is, from its files alone: served as a kind, or refused with the reason.

The folders are config-only (no weights): the kind is read, and a refusal made, before
anything is loaded. The layouts are those sentence-transformers 6 and ``save_pretrained``
write (``modules.json`` types and ``config_sentence_transformers.json``'s ``model_type``
as sentence-transformers 6.3 saves them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchserve.errors import ConfigError
from batchserve.models.kinds import CLASSIFIER, EMBEDDING, RERANKER, SERVES, folder_kind

TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
POOLING = "sentence_transformers.sentence_transformer.modules.pooling.Pooling"
NORMALIZE = "sentence_transformers.base.modules.normalize.Normalize"
SPLADE = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"
ROUTER = "sentence_transformers.base.modules.router.Router"


def folder(
    path: Path,
    architectures: list[str],
    *,
    modules: list[str] | None = None,
    st_type: str | None = None,
    **config: Any,
) -> Path:
    """A config-only model folder: ``config.json`` and, for a sentence-transformers one,
    ``modules.json`` and ``config_sentence_transformers.json``."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": architectures, **config}))
    if modules is not None:
        entries = [
            {"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_M", "type": t}
            for i, t in enumerate(modules)
        ]
        (path / "modules.json").write_text(json.dumps(entries))
    if st_type is not None:
        st: dict[str, Any] = {"model_type": st_type, "prompts": {}, "default_prompt_name": None}
        (path / "config_sentence_transformers.json").write_text(json.dumps(st))
    return path


def refusal(path: Path, *, trust_remote_code: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        folder_kind(path).check(path, trust_remote_code=trust_remote_code)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    return message


@pytest.mark.parametrize(
    ("architectures", "modules", "st_type"),
    [
        # Qwen3-Embedding, as sentence-transformers saves it: a decoder, last-token pooling.
        (["Qwen3ForCausalLM"], [TRANSFORMER, POOLING, NORMALIZE], "SentenceTransformer"),
        (["Qwen3Model"], [TRANSFORMER, POOLING, NORMALIZE], "SentenceTransformer"),
        # all-mpnet-base-v2's config names its pre-training head; modules.json says what it is.
        (["MPNetForMaskedLM"], [TRANSFORMER, POOLING, NORMALIZE], None),
        (["BertModel"], [TRANSFORMER, POOLING], "SentenceTransformer"),
        # save_pretrained of a bare encoder or decoder: mean pooling, as sentence-transformers.
        (["BertModel"], None, None),
        (["Qwen3Model"], None, None),
    ],
)
def test_embedders_are_served_whatever_their_architecture(
    tmp_path: Path, architectures: list[str], modules: list[str] | None, st_type: str | None
) -> None:
    path = folder(tmp_path / "m", architectures, modules=modules, st_type=st_type)
    found = folder_kind(path)
    assert (found.kind, found.refusal, found.architecture) == (EMBEDDING, None, architectures[0])
    found.check(path)


def test_rerankers_and_classifiers_as_cross_encoder_and_save_pretrained_write_them(
    tmp_path: Path,
) -> None:
    arch = ["XLMRobertaForSequenceClassification"]
    saved = folder(
        tmp_path / "ce", arch, modules=[TRANSFORMER], st_type="CrossEncoder", num_labels=1
    )
    assert folder_kind(saved).kind is RERANKER
    folder_kind(saved).check(saved)
    labels = {"0": "no", "1": "yes", "2": "maybe"}
    pretrained = folder(tmp_path / "c", arch, id2label=labels)
    assert (folder_kind(pretrained).kind, folder_kind(pretrained).refusal) == (CLASSIFIER, None)


@pytest.mark.parametrize(
    ("architectures", "modules", "st_type", "words"),
    [
        (["BertForMaskedLM"], None, None, "a masked-language-model head with no "),
        (["BertForPreTraining"], None, None, "a pre-training head"),
        (["Qwen3ForCausalLM"], None, None, "a causal language model with no "),
        (["GPT2LMHeadModel"], None, None, "declares no reranking template"),
        (["BertForTokenClassification"], None, None, "a token classification head"),
        (["T5ForConditionalGeneration"], None, None, "a sequence-to-sequence generation"),
        (["BertForMaskedLM"], [ROUTER, SPLADE], "SparseEncoder", "a SparseEncoder of modules"),
        (["BertModel"], [TRANSFORMER], "MultiVectorEncoder", "a multi-vector encoder"),
    ],
)
def test_what_batchserve_does_not_serve_is_refused_with_what_was_found(
    tmp_path: Path,
    architectures: list[str],
    modules: list[str] | None,
    st_type: str | None,
    words: str,
) -> None:
    path = folder(tmp_path / "m", architectures, modules=modules, st_type=st_type)
    message = refusal(path)
    assert words in message
    assert architectures[0] in message or (modules and modules[-1].rpartition(".")[2] in message)
    assert message.endswith(SERVES)


def test_image_and_audio_models_are_refused(tmp_path: Path) -> None:
    clip = folder(tmp_path / "clip", ["CLIPModel"], vision_config={}, text_config={})
    assert "an image or audio model (config.json has vision_config)" in refusal(clip)
    clap = folder(tmp_path / "clap", ["ClapModel"], audio_config={})
    assert "config.json has audio_config" in refusal(clap)
    siglip = folder(tmp_path / "siglip", ["SiglipModel"])
    (siglip / "preprocessor_config.json").write_text("{}")
    assert "preprocessor_config.json is there" in refusal(siglip)


def test_remote_code_is_refused_unless_trusted(tmp_path: Path) -> None:
    auto_map = {"AutoConfig": "configuration_x.XConfig", "AutoModel": "modeling_x.XModel"}
    path = folder(
        tmp_path / "m",
        ["XLMRobertaModel"],
        modules=[TRANSFORMER, POOLING],
        st_type="SentenceTransformer",
        auto_map=auto_map,
    )
    found = folder_kind(path)
    assert found.remote_code == (
        "AutoConfig=configuration_x.XConfig",
        "AutoModel=modeling_x.XModel",
    )
    message = refusal(path)
    assert "auto_map names code the folder ships (AutoConfig=configuration_x.XConfig" in message
    assert "--trust-remote-code" in message
    found.check(path, trust_remote_code=True)
    # Trust lifts only that refusal.
    mlm = folder(tmp_path / "mlm", ["XForMaskedLM"], auto_map=auto_map)
    assert "masked-language-model" in refusal(mlm, trust_remote_code=True)


def test_an_older_layout_s_config_is_read_from_the_transformer_s_folder(tmp_path: Path) -> None:
    path = tmp_path / "old"
    folder(path / "0_Transformer", ["BertModel"], auto_map={"AutoModel": "x.Y"})
    entries = [{"idx": 0, "name": "0", "path": "0_Transformer", "type": TRANSFORMER}]
    (path / "modules.json").write_text(json.dumps(entries))
    assert folder_kind(path).remote_code == ("AutoModel=x.Y",)


def test_malformed_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "modules.json").write_text('{"a": 1}')
    with pytest.raises(ConfigError, match=r"modules\.json must hold a JSON list, got dict"):
        folder_kind(tmp_path)
