"""The engines' loader: one call loads any SPEC, the engine-free ones through the core's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from batchserve.config import CostEstimate
from batchserve.engines import loader
from batchserve.engines.heads import VectorHead
from batchserve.engines.model import EngineModel
from batchserve.engines.runtime import Runtime, default_workers
from batchserve.errors import ConfigError
from batchserve.models.kinds import EMBEDDING, GENERIC, Kind, Prompts
from batchserve.models.loader import needs_engine


def test_a_spec_that_needs_no_engine_is_loaded_by_the_core() -> None:
    m = loader.load_model("synthetic:fixed=8ms,per_item=0.25ms,dim=4")
    assert (m.kind, m.dimension) == (EMBEDDING, 4)
    assert m.initial_cost == CostEstimate(fixed_s=0.008, per_item_s=0.00025)
    assert m.engine is None
    assert loader.load_model("json:dumps").kind is GENERIC
    with pytest.raises(ConfigError, match="model spec must be"):
        loader.load_model("nope")


def test_minilm_and_folders_need_an_engine(tmp_path: Path) -> None:
    assert needs_engine("minilm")
    assert needs_engine("minilm:backend=onnx-int8,threads=1")
    assert needs_engine(str(tmp_path))
    assert needs_engine(f"{tmp_path}:backend=openvino")
    assert not needs_engine("synthetic:dim=8")
    assert not needs_engine("json:dumps")


def test_the_specs_options_override_the_runtime_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Runtime] = []

    class Pipeline:  # what the loader reads of an embedding folder's pipeline
        prompts = Prompts(prompts={})
        dimension, window, pooling, normalized = 3, 16, "cls", False
        padding_side, tokenizer = "right", None

        def describe(self) -> dict[str, str]:
            return {"layout": "save_pretrained"}

    class Runner:  # what it reads of how the engine runs
        backend, dtype, device, threads, graphs, grid = "onnx", "float32", "cpu", 1, None, None

    def fake_load(
        path: Path, rt: Runtime, *, gated: bool = True, kind: Kind = EMBEDDING
    ) -> EngineModel:
        assert path == tmp_path
        seen.append(rt)
        return EngineModel(cast(Any, Runner()), VectorHead(cast(Any, Pipeline())))

    monkeypatch.setattr(loader, "_load_engine", fake_load)
    given = Runtime(backend="torch", threads=4)
    m = loader.load_model(f"{tmp_path}:backend=onnx,threads=1", given)
    assert (seen[0].backend, seen[0].threads) == ("onnx", 1)
    assert (m.kind, m.dimension, m.max_input_tokens) == (EMBEDDING, 3, 16)
    assert m.workers == default_workers("cpu", 1)
    assert (m.pooling, m.normalized, m.prompts) == ("cls", False, None)
    assert m.engine == {
        "backend": "onnx", "precision": "float32", "device": "cpu", "threads": 1, "choice": None,
        "gate": None, "pipeline": {"layout": "save_pretrained"},
    }  # fmt: skip
    with pytest.raises(ConfigError, match="threads must be an integer"):
        loader.load_model(f"{tmp_path}:threads=x", given)
