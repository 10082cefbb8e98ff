"""``batchserve profile --backend``: per backend, the cost curve beside the quality figures."""

from __future__ import annotations

import json
import pathlib

import pytest

from batchserve.cli import main
from batchserve.cli.profile_backends import BackendResult, format_backends, parse_backends
from batchserve.errors import ConfigError
from batchserve.models.profiling import Profile
from batchserve.models.quality import Quality


def test_parse_backends() -> None:
    assert parse_backends("all") == ["torch", "onnx", "onnx-int8", "openvino", "openvino-int8"]
    assert parse_backends("onnx, torch,onnx") == ["onnx", "torch"]
    with pytest.raises(ConfigError, match="got 'tensorrt'"):
        parse_backends("torch,tensorrt")
    with pytest.raises(ConfigError, match="got 'auto'"):  # that is --backends
        parse_backends("auto")


def test_the_table_puts_speed_beside_quality_and_says_why_a_backend_was_refused() -> None:
    prof = Profile(
        model="minilm",
        fixed_s=0.010,
        per_item_s=0.005,
        r_squared=0.999,
        max_rel_residual=0.01,
        points=((1, 0.015), (8, 0.050)),
        repeats=1,
        created="",
    )
    good = Quality(texts=10, mean_cosine=0.995, min_cosine=0.97, queries=4, ranking_agreement=1.0)
    bad = Quality(texts=10, mean_cosine=0.96, min_cosine=0.9, queries=0, ranking_agreement=1.0)
    text = format_backends(
        [
            BackendResult(backend="onnx", spec="s", profile=prof, quality=good),
            BackendResult(backend="onnx-int8", spec="s", profile=prof, quality=bad),
            BackendResult(
                backend="openvino-int8", spec="s", profile=None, quality=None, refused="gate: x"
            ),
        ],
        8,
    )
    lines = text.splitlines()
    assert lines[1].split()[-4:] == ["0.9950", "0.9700", "100.0%", "pass"]
    assert lines[1].split()[4] == "160.0"  # 8 / (10 ms + 8 * 5 ms)
    assert lines[2].split()[-4:] == ["0.9600", "0.9000", "-", "FAIL"]  # no queries: no NN
    assert lines[3] == "openvino-int8  refused: gate: x"


@pytest.mark.slow
def test_cli_profiles_each_backend_with_its_quality(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxruntime")
    qs = tmp_path / "set.json"
    qs.write_text(
        json.dumps(
            {
                "texts": ["a short query", "A longer sentence about batching. " * 5, "x"],
                "queries": ["what is batching"],
                "passages": ["Batching groups requests.", "Bread needs yeast."],
            }
        )
    )
    out = tmp_path / "prof.json"
    argv = ["profile", "--model", "minilm", "--backend", "torch,onnx", "--threads", "1"]
    argv += ["--sizes", "1,2", "--repeats", "1", "--warmup", "0", "--json", "-o", str(out)]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--quality-set", str(qs)]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["backend"] for r in rows] == ["torch", "onnx"]
    for row in rows:
        assert row["refused"] is None
        assert (
            row["spec"] == f"minilm:backend={row['backend']},threads=1,cache_dir={tmp_path}/cache"
        )
        assert [p[0] for p in row["profile"]["points"]] == [1, 2]
        assert row["quality"]["texts"] == 3
        assert row["quality"]["mean_cosine"] > 0.9999
        assert row["quality"]["ranking_agreement"] == 1.0
        assert (tmp_path / f"prof-{row['backend']}.json").is_file()
