"""``batchserve profile --backend``: per backend, the cost curve beside the quality figures."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from batchserve.cli import main
from batchserve.cli.profile_backends import BackendResult, format_backends, parse_backends
from batchserve.engines.quality import Quality
from batchserve.errors import ConfigError
from batchserve.models.profiling import Profile


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
    good = Quality(
        texts=10, mean_cosine=0.995, min_cosine=0.97, queries=4, ranking_agreement=1.0,
        precision="int8",
    )  # fmt: skip
    bad = Quality(texts=10, mean_cosine=0.96, min_cosine=0.9, queries=0, ranking_agreement=1.0)
    text = format_backends(
        [
            BackendResult(backend="onnx-int8", spec="s", profile=prof, quality=good),
            BackendResult(backend="onnx", spec="s", profile=prof, quality=bad),
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
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], engine_cache: pathlib.Path
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
    # the run's export cache: its ONNX export is the one the other engine tests use
    argv += ["--cache-dir", str(engine_cache), "--quality-set", str(qs)]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["backend"] for r in rows] == ["torch", "onnx"]
    for row in rows:
        assert row["refused"] is None
        assert row["spec"] == f"minilm:backend={row['backend']},threads=1,cache_dir={engine_cache}"
        assert [p[0] for p in row["profile"]["points"]] == [1, 2]
        assert row["quality"]["texts"] == 3
        assert row["quality"]["mean_cosine"] > 0.9999
        assert row["quality"]["ranking_agreement"] == 1.0
        assert (tmp_path / f"prof-{row['backend']}.json").is_file()


def test_profile_backends_measures_afresh_and_prints_the_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    from batchserve.cli import profile_backends
    from batchserve.engines.hardware import Engine
    from batchserve.engines.runtime import Runtime
    from batchserve.engines.verdict import Trial, Verdict

    calls: list[tuple[pathlib.Path, Runtime, bool]] = []
    good = Quality(
        texts=10, mean_cosine=0.995, min_cosine=0.97, queries=4, ranking_agreement=1.0,
        precision="int8",
    )  # fmt: skip
    verdict = Verdict(
        chosen=Engine("onnx-int8", "int8"),
        device="cpu",
        batch_size=16,
        threads=1,
        workers=2,
        trials=(
            Trial(engine=Engine("torch", "float32"), items_per_s=10.0),
            Trial(engine=Engine("onnx-int8", "int8"), items_per_s=16.0, quality=good),
            Trial(engine=Engine("torch", "bfloat16"), unavailable="no bf16 here"),
        ),
        machine={},
        versions={},
        key="k",
        seconds=1.0,
        created="",
    )

    def fake(path: pathlib.Path, runtime: Runtime, *, refresh: bool = False) -> Any:
        calls.append((path, runtime, refresh))
        return None, verdict

    monkeypatch.setattr(profile_backends, "choose_engine", fake)
    argv = ["profile", "--backends", "--max-batch-size", "16", "--threads", "1"]
    assert main([*argv, "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "onnx-int8/int8 *" in out
    assert "1.60x" in out
    assert "no bf16 here" in out
    assert "backend auto chose onnx-int8/int8 (1.60x torch/float32) at batch 16" in out
    (_, runtime, refresh) = calls[0]
    assert (runtime.backend, runtime.batch_size, runtime.threads, refresh) == ("auto", 16, 1, True)
    assert runtime.cache_dir == str(tmp_path)
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"] == {"backend": "onnx-int8", "precision": "int8"}
    assert data["speedup_vs_torch_fp32"] == 1.6
    assert main(["profile", "--backends", "--model", "synthetic"]) != 0
    assert "--backends applies to minilm, a model folder or a Hub id" in capsys.readouterr().err
