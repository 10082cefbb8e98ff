"""``batchserve serve`` settings: flags, per-model flags, the config file, precedence."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from batchserve.cli import build_parser
from batchserve.cli.serve import build_settings
from batchserve.errors import ConfigError
from batchserve.server import ServerSettings


def settings(argv: list[str], env: dict[str, str] | None = None) -> ServerSettings:
    args: argparse.Namespace = build_parser().parse_args(["serve", *argv])
    return build_settings(args, environ=env or {})


def test_defaults_serve_minilm_on_localhost_8000() -> None:
    s = settings([])
    assert (s.host, s.port) == ("127.0.0.1", 8000)
    assert [(m.name, m.spec) for m in s.models] == [("all-MiniLM-L6-v2", "minilm")]
    assert s.models[0].batch.max_batch_size == 32
    assert s.api_key is None


def test_models_with_and_without_names() -> None:
    s = settings(
        ["--model", "synthetic:fixed=8ms,per_item=0.25ms", "--model", "fast=synthetic:fixed=1ms"]
    )
    assert [(m.name, m.spec) for m in s.models] == [
        ("synthetic", "synthetic:fixed=8ms,per_item=0.25ms"),
        ("fast", "synthetic:fixed=1ms"),
    ]


def test_batcher_flags_for_every_model_and_for_one() -> None:
    s = settings(
        [
            "--model", "a=synthetic",
            "--model", "b=synthetic",
            "--max-batch-size", "16",
            "--max-wait", "5ms",
            "--max-wait", "b=0ms",
            "--queue-size", "b=10",
            "--workers", "2",
            "--timeout", "250ms",
            "--admission", "a=off",
        ]
    )  # fmt: skip
    a, b = s.models
    assert (a.batch.max_batch_size, b.batch.max_batch_size) == (16, 16)
    assert (a.batch.max_wait_s, b.batch.max_wait_s) == (0.005, 0.0)
    assert (a.batch.queue_size, b.batch.queue_size) == (1024, 10)
    assert a.batch.workers == b.batch.workers == 2
    assert a.timeout_s == b.timeout_s == 0.25
    assert (a.batch.admission, b.batch.admission) == (False, True)


def test_batches_by_tokens_flags() -> None:
    s = settings(
        [
            "--model", "a=minilm",
            "--model", "b=minilm",
            "--batch-by", "b=count",
            "--max-batch-tokens", "a=4096",
            "--length-window", "2",
        ]
    )  # fmt: skip
    a, b = s.models
    assert (a.batch.batch_by, b.batch.batch_by) == ("auto", "count")
    assert (a.batch.max_batch_tokens, b.batch.max_batch_tokens) == (4096, None)
    assert a.batch.length_window == b.batch.length_window == 2


def test_config_file_and_precedence(tmp_path: pathlib.Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'host = "0.0.0.0"\nport = 9000\ndrain_timeout = "5s"\nmax_inputs = 7\n'
        '[defaults]\nmax_batch_size = 8\nmax_wait = "3ms"\ntimeout = "1s"\n'
        '[models.one]\nspec = "synthetic"\nmax_batch_size = 4\n'
        '[models.two]\nspec = "synthetic:fixed=1ms"\n'
    )
    s = settings(["--config", str(cfg)])
    assert (s.host, s.port, s.drain_timeout_s, s.limits.max_inputs) == ("0.0.0.0", 9000, 5.0, 7)
    one, two = s.models
    assert (one.name, one.batch.max_batch_size, two.batch.max_batch_size) == ("one", 4, 8)
    assert one.batch.max_wait_s == 0.003
    assert one.timeout_s == 1.0
    # Flags beat the file; a flag for every model beats the file's per-model value.
    s = settings(["--config", str(cfg), "--port", "0", "--max-batch-size", "2"])
    assert s.port == 0
    assert [m.batch.max_batch_size for m in s.models] == [2, 2]
    # --model replaces the file's list; the file's [models.NAME] still applies.
    s = settings(["--config", str(cfg), "--model", "one=synthetic:fixed=2ms"])
    assert [(m.name, m.batch.max_batch_size) for m in s.models] == [("one", 4)]


def test_api_key_from_flag_or_environment() -> None:
    assert settings(["--api-key", "f"]).api_key == "f"
    assert settings([], {"BATCHSERVE_API_KEY": "e"}).api_key == "e"
    assert settings(["--api-key", "f"], {"BATCHSERVE_API_KEY": "e"}).api_key == "f"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--max-wait", "2"], "duration with a unit"),
        (["--max-batch-size", "0"], "max_batch_size must be >= 1"),
        (["--max-batch-size", "zz=4"], "no model named 'zz'"),
        (["--admission", "maybe"], "on or off"),
        (["--model", "a=synthetic", "--model", "a=synthetic"], "unique"),
        (["--port", "70000"], "port must be in 0..65535"),
        (["--max-inputs", "0"], "max_inputs must be an integer >= 1"),
        (["--batch-by", "words"], "batch_by must be one of auto, count, tokens"),
        (["--batch-by", "count", "--max-batch-tokens", "512"], "needs batches by tokens"),
    ],
)
def test_bad_settings_name_the_setting(argv: list[str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        settings(argv)


def test_bad_config_file_keys(tmp_path: pathlib.Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[defaults]\nmax_batch = 3\n")
    with pytest.raises(ConfigError, match=r"\[defaults\]: unknown key 'max_batch'"):
        settings(["--config", str(cfg)])
    cfg.write_text("[models.x]\nmax_batch_size = 3\n")
    with pytest.raises(ConfigError, match="needs spec"):
        settings(["--config", str(cfg)])
    cfg.write_text("port = [")
    with pytest.raises(ConfigError, match="config file"):
        settings(["--config", str(cfg)])


def test_the_library_reads_the_config_file_and_its_overrides(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(
        'port = 9000\n[defaults]\nmax_wait = "5ms"\n'
        '[models.fast]\nspec = "synthetic:fixed=1ms"\nmax_batch_size = 4\n'
    )
    settings = ServerSettings.from_toml(
        config, overrides={"port": 0, "max_batch_size": ["fast=8"]}, environ={}
    )
    assert settings.port == 0
    (model,) = settings.models
    assert (model.name, model.batch.max_batch_size, model.batch.max_wait_s) == ("fast", 8, 0.005)


def _help(command: str) -> str:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return " ".join(commands.choices[command].format_help().split())


def test_serve_help_shows_the_built_in_defaults_of_flags_the_file_may_set() -> None:
    text = _help("serve")
    defaults = ServerSettings()
    assert f"address to bind (default: {defaults.host})" in text
    assert f"(default: {defaults.port})" in text
    assert "a batch closes at this many items (default: 32)" in text
    assert "waited this long (default: 2ms)" in text
    assert "deadline of a request that states none (default: 30s)" in text
    assert "(default: on)" in text
    # Unset, so that a config file can set them: the flags' own defaults stay empty.
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.max_batch_size, args.timeout) == (None, None, [], [])


@pytest.mark.parametrize("command", ["demo", "load", "profile", "simulate", "top", "tune"])
def test_every_subcommand_shows_defaults_through_argparse(command: str) -> None:
    text = _help(command)
    assert "(default: None)" not in text
    assert "(default: %" not in text
    assert "(default:" in text or command == "top"
