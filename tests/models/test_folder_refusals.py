"""Folders of kinds batchserve does not serve are refused at start, naming what was found.

Config-only folders (nothing is loaded before the refusal): an image model saved as ViT
saves it (no nested ``vision_config``, no processor file), an image classifier, CLIP, an
audio encoder, a token classifier, a head of a name nobody lists, and a ``model_type``
transformers does not know. Each is refused by the engine loader and by
``batchserve serve --model FOLDER``, the message naming the folder, what it found and
what batchserve serves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchserve.engines.loader import load_model
from batchserve.errors import ConfigError
from batchserve.models.kinds import EMBEDDING, RERANKER, SERVES, folder_kind

pytest.importorskip("transformers")


def _folder(path: Path, architectures: list[str], **config: Any) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": architectures, **config}))
    return path


_VIT = {"model_type": "vit", "image_size": 224, "patch_size": 16, "num_channels": 3}

#: name -> (architectures, config, words the refusal holds)
CASES: dict[str, tuple[list[str], dict[str, Any], tuple[str, ...]]] = {
    "vit": (["ViTModel"], _VIT, ("an image or audio model", "config.json has image_size")),
    "vit-classifier": (
        ["ViTForImageClassification"],
        _VIT,
        ("an image or audio model", "patch_size"),
    ),
    "clip": (
        ["CLIPModel"],
        {"model_type": "clip", "text_config": {}, "vision_config": {}},
        ("an image or audio model", "vision_config"),
    ),
    "whisper": (
        ["WhisperModel"],
        {"model_type": "whisper", "num_mel_bins": 80},
        ("an image or audio model", "num_mel_bins"),
    ),
    "token-classifier": (
        ["BertForTokenClassification"],
        {"model_type": "bert"},
        ("a token classification head", "BertForTokenClassification"),
    ),
    "unknown-head": (
        ["FooBarForSomething"],
        {"model_type": "bert"},
        ("a head batchserve does not know", "FooBarForSomething", "ForSomething"),
    ),
    "text-image-classifier": (
        ["BertForImageClassification"],
        {"model_type": "bert"},
        ("a head batchserve does not know", "ForImageClassification"),
    ),
    "unknown-type": (
        ["FooBarModel"],
        {"model_type": "foobar"},
        ("model_type 'foobar'", "transformers", "does not know"),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_loader_refuses_it_naming_what_it_found(tmp_path: Path, name: str) -> None:
    architectures, config, words = CASES[name]
    path = _folder(tmp_path / name, architectures, **config)
    with pytest.raises(ConfigError) as info:
        load_model(f"{path}:backend=torch")
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    for word in words:
        assert word in message
    assert message.endswith(SERVES)


def test_a_bare_encoder_and_a_sequence_classifier_are_not_unknown_heads(tmp_path: Path) -> None:
    bare = folder_kind(_folder(tmp_path / "bare", ["NewEncoderModel"], model_type="bert"))
    assert (bare.kind, bare.refusal) == (EMBEDDING, None)
    scorer = _folder(tmp_path / "ce", ["NewForSequenceClassification"], num_labels=1)
    assert (folder_kind(scorer).kind, folder_kind(scorer).refusal) == (RERANKER, None)
    # "For" must begin a head's name: an architecture that merely holds the letters is none.
    fork = folder_kind(_folder(tmp_path / "fork", ["Formosa"], model_type="bert"))
    assert fork.refusal is None


@pytest.mark.parametrize("name", ["token-classifier", "unknown-head", "vit", "unknown-type"])
def test_serve_exits_at_start_with_the_refusal(tmp_path: Path, name: str) -> None:
    architectures, config, words = CASES[name]
    path = _folder(tmp_path / name, architectures, **config)
    out = subprocess.run(
        [sys.executable, "-m", "batchserve", "serve", "--model", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode != 0
    assert f"ConfigError: {path}: " in out.stderr
    for word in words:
        assert word in out.stderr
    assert SERVES in out.stderr
