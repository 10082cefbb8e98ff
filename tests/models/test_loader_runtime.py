"""Runtime options in a model SPEC: ``minilm:backend=onnx-int8,threads=1``."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchserve.errors import ConfigError
from batchserve.models.loader import default_model_name, split_runtime, with_runtime


def test_split_runtime_takes_options_of_minilm_and_folders(tmp_path: Path) -> None:
    assert split_runtime("minilm") == ("minilm", {})
    assert split_runtime("minilm:backend=onnx,threads=1") == (
        "minilm",
        {"backend": "onnx", "threads": "1"},
    )
    # a device holds a ':' of its own
    assert split_runtime("minilm:device=cuda:1,dtype=bfloat16") == (
        "minilm",
        {"device": "cuda:1", "dtype": "bfloat16"},
    )
    assert split_runtime(f"{tmp_path}:backend=openvino") == (str(tmp_path), {"backend": "openvino"})


@pytest.mark.parametrize("spec", ["synthetic:fixed=1ms", "json:dumps", "no/such/dir:backend=onnx"])
def test_other_specs_come_back_whole(spec: str) -> None:
    assert split_runtime(spec) == (spec, {})


def test_bad_options_name_the_option() -> None:
    with pytest.raises(ConfigError, match="unknown model option 'foo'"):
        split_runtime("minilm:foo=1")
    with pytest.raises(ConfigError, match="must be KEY=VALUE, got 'threads='"):
        split_runtime("minilm:threads=")


def test_with_runtime_merges_over_the_specs_own_options() -> None:
    assert with_runtime("minilm", {}) == "minilm"
    assert with_runtime("minilm:device=cuda:1,threads=2", {"threads": "1", "backend": "onnx"}) == (
        "minilm:backend=onnx,device=cuda:1,threads=1"
    )
    with pytest.raises(ConfigError, match="apply to minilm, a model folder or a Hub id"):
        with_runtime("synthetic", {"backend": "onnx"})


def test_the_default_name_ignores_the_options() -> None:
    assert default_model_name("minilm:backend=onnx-int8") == "all-MiniLM-L6-v2"
