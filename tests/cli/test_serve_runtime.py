"""``batchserve serve``'s runtime flags (--backend, --device, --threads, --revision...)."""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

import pytest

from batchserve.cli import build_parser
from batchserve.cli.serve import build_settings
from batchserve.errors import ConfigError
from batchserve.server import ServerSettings


def settings(argv: list[str]) -> ServerSettings:
    args: argparse.Namespace = build_parser().parse_args(["serve", *argv])
    return build_settings(args, environ={})


def specs(argv: list[str]) -> list[tuple[str, str]]:
    return [(m.name, m.spec) for m in settings(argv).models]


def test_runtime_flags_become_spec_options_of_the_builtin_model() -> None:
    assert specs(["--backend", "onnx-int8", "--threads", "1"]) == [
        ("all-MiniLM-L6-v2", "minilm:backend=onnx-int8,threads=1")
    ]
    assert specs([]) == [("all-MiniLM-L6-v2", "minilm")]


def test_backend_auto_measures_at_the_batch_size_it_will_serve() -> None:
    assert specs(["--max-batch-size", "64"]) == [("all-MiniLM-L6-v2", "minilm:batch_size=64")]
    assert specs(["--max-batch-size", "64", "--backend", "torch"]) == [
        ("all-MiniLM-L6-v2", "minilm:backend=torch")
    ]
    assert specs(["--model", "synthetic", "--max-batch-size", "64"]) == [("synthetic", "synthetic")]


def test_flags_for_every_model_skip_models_that_take_none() -> None:
    assert specs(["--model", "minilm", "--model", "synthetic", "--device", "cpu"]) == [
        ("all-MiniLM-L6-v2", "minilm:device=cpu"),
        ("synthetic", "synthetic"),
    ]


def test_flags_for_one_model_override_the_specs_own_options() -> None:
    argv = ["--model", "a=minilm:device=cpu,threads=2", "--model", "b=minilm"]
    argv += ["--threads", "a=1", "--device", "b=cuda:1", "--dtype", "b=bfloat16"]
    assert specs(argv) == [
        ("a", "minilm:device=cpu,threads=1"),
        ("b", "minilm:device=cuda:1,dtype=bfloat16"),
    ]


def test_the_config_file_takes_runtime_keys(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(
        '[defaults]\nthreads = 1\n[models.emb]\nspec = "minilm"\nbackend = "onnx"\n'
        f'cache_dir = "{tmp_path}"\n'
    )
    assert specs(["--config", str(path)]) == [
        ("emb", f"minilm:backend=onnx,threads=1,cache_dir={tmp_path}")
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "tensorrt"], "backend must be one of auto, torch, onnx"),
        (["--threads", "0"], "threads must be an integer >= 1, got 0"),
        (["--threads", "x"], "--threads must be an integer, got 'x'"),
        (["--device", "gpu"], "device must be auto, cpu, cuda, cuda:N or mps"),
        (["--backend", "onnx", "--dtype", "float16"], "dtype float16 is not a precision of"),
        (
            ["--model", "synthetic", "--backend", "synthetic=onnx"],
            "model synthetic: backend apply to minilm, a model folder or a Hub id",
        ),
    ],
)
def test_a_bad_runtime_flag_fails_at_start_up(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings(argv)


def test_workers_nobody_set_are_the_models_own() -> None:
    (model,) = settings([]).models
    assert model.auto_workers
    # Set, even to 1, they are what was set.
    (model,) = settings(["--workers", "1"]).models
    assert not model.auto_workers
    assert model.batch.workers == 1


def test_a_folder_of_a_kind_not_served_stops_serve_at_start(tmp_path: pathlib.Path) -> None:
    # A config-only folder: the refusal comes before anything is loaded.
    folder = tmp_path / "qwen-lm"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-m", "batchserve", "serve", "--port", "0", "--model", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 1
    assert f"ConfigError: {folder}: a causal language model with no " in out.stderr
    assert "ready" not in out.stdout
