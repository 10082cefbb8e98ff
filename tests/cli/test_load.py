"""``batchserve load`` end to end against the tiny server: JSON, CSV, sweep and plot."""

import csv
import io
import json
from pathlib import Path

import pytest

from batchserve.cli import build_parser, main
from batchserve.cli.load import config_from_args
from batchserve.workload.summary import DEMO_KEYS
from loadgen_server import Reply, TinyServer


def test_plot_without_sweep_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", "http://127.0.0.1:9", "--plot", "x.png"]) == 1
    assert "ConfigError: --plot needs --sweep" in capsys.readouterr().err


def test_a_bad_url_names_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", "ftp://h"]) == 1
    assert (
        "ConfigError: url must look like http://host:port or grpc://host:port, got 'ftp://h'"
        in capsys.readouterr().err
    )


def test_a_grpc_url_speaks_kserve_unless_told_otherwise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["load", "grpc://127.0.0.1:9"])
    assert config_from_args(args).api == "kserve"
    assert main(["load", "grpc://127.0.0.1:9", "--api", "openai"]) == 1
    assert "ConfigError: api must be kserve with a grpc:// url, got 'openai'" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_json_text_and_csv_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    with TinyServer(lambda s: Reply(headers={"X-Batch-Id": "1"})) as srv:
        args = ["load", srv.url, "--rate", "100", "--duration", "0.2s", "--quiet"]
        assert main([*args, "--json"]) == 0
        row = json.loads(capsys.readouterr().out)
        assert list(row)[: len(DEMO_KEYS)] == list(DEMO_KEYS)
        assert (row["sent"], row["ok"], row["offered_per_s"]) == (20, 20, 100.0)

        assert main([*args, "--timeout", "250ms", "--inputs", "3"]) == 0
        text = capsys.readouterr().out
        assert "deadline 250ms" in text
        assert "3 inputs/request" in text
        assert "openai 100/s" in text
        assert "generator lag" in text

        assert main([*args, "--csv", "--api", "kserve"]) == 0
        rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
        assert rows[0]["api"] == "kserve"
        assert rows[0]["ok"] == "20"
    assert srv.seen[25].headers["x-request-timeout"] == "0.25"
    assert b'"input":["' in srv.seen[25].body


@pytest.mark.slow
def test_sweep_prints_a_row_per_rate_and_writes_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "sweep.png"
    with TinyServer(lambda s: Reply(delay_s=0.002, headers={"X-Batch-Id": str(s.seq)})) as srv:
        status = main(
            [
                "load", srv.url, "--sweep", "50,100", "--duration", "0.2s", "--sweep-pause",
                "0s", "--json", "--plot", str(png), "--quiet", "--name", "tiny",
            ]
        )  # fmt: skip
    assert status == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in rows] == ["tiny 50/s", "tiny 100/s"]
    assert [r["sent"] for r in rows] == [10, 20]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_manuals_load_commands_make_valid_configs() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "load-testing.md").read_text()
    block = page.split("```sh", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [line.split() for line in block.splitlines() if line.startswith("batchserve load")]
    assert len(commands) == 3  # HTTP, gRPC, a sweep
    for words in commands:
        words = words[1 : words.index(">")] if ">" in words else words[1:]
        args = build_parser().parse_args(words)
        assert args.run is not None
        config_from_args(args)  # the flags make a valid config
