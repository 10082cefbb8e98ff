"""Model SPECs: names, the synthetic model's stated cost, imported objects."""

from __future__ import annotations

import pytest

from batchserve.config import CostEstimate
from batchserve.errors import ConfigError
from batchserve.models.kinds import EMBEDDING, GENERIC
from batchserve.models.loader import default_model_name, load_model


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("minilm", "all-MiniLM-L6-v2"),
        ("synthetic", "synthetic"),
        ("synthetic:fixed=8ms,per_item=0.25ms", "synthetic"),
        ("package.module:make_model", "make_model"),
        ("pkg.mod:Class.attr", "attr"),
        ("/models/my model/", "my-model"),
    ],
)
def test_default_names(spec: str, name: str) -> None:
    assert default_model_name(spec) == name


def test_synthetic_states_its_cost_and_is_an_embedding_model() -> None:
    m = load_model("synthetic:fixed=8ms,per_item=0.25ms,dim=16")
    assert m.kind is EMBEDDING
    assert m.dimension == 16
    assert m.initial_cost == CostEstimate(fixed_s=0.008, per_item_s=0.00025)
    assert load_model("synthetic:dim=0").kind is GENERIC


def test_an_imported_object_declares_itself_an_embedding_model() -> None:
    m = load_model("batchserve.models.synthetic:SyntheticModel")
    assert m.kind is GENERIC  # no dimension: generic
    m = load_model("json:dumps")
    assert m.kind is GENERIC


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("nope", "model spec must be"),
        ("no_such_module_xyz:f", "cannot import"),
        ("json:no_such_attr", "no attribute"),
        ("json:__doc__", "not callable"),
        ("synthetic:speed=3", "unknown synthetic model option"),
        ("minilm", "runs on an engine: load it with batchserve.engines.loader"),
        ("minilm:backend=onnx", "runs on an engine"),
    ],
)
def test_bad_specs_say_why(spec: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_model(spec)
