"""Exports to ONNX and OpenVINO: made from the shipped weights, cached, raced, gated.

The fp32 exports must answer what torch answers (cosine >= 0.9999, the same token counts)
for texts of every length, truncation included. An int8 load runs its quality gate (on a
slice of the shipped set here, to keep the test short; ``batchserve profile --backends``
and ``bench/models/engine_gate.py`` give the full set's figures), refuses an engine that does not
keep the meaning, and serves one named that only fails the index-shaped bounds (dynamic
int8's batch invariance), with a warning; the fp32 engines' answers do not depend on their
batch-mates. Exports take seconds each; the suite shares them through one cache.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")
onnx = pytest.importorskip("onnx")

from batchserve.engines import export  # noqa: E402
from batchserve.engines.embeddings import builtin, builtin_path  # noqa: E402
from batchserve.engines.exported import on_exported  # noqa: E402
from batchserve.engines.gate import gate, set_digest  # noqa: E402
from batchserve.engines.hardware import REFERENCE, Engine  # noqa: E402
from batchserve.engines.loader import load_model  # noqa: E402
from batchserve.engines.model import EngineModel  # noqa: E402
from batchserve.engines.quality import MIN_INVARIANCE, Quality, invariance  # noqa: E402
from batchserve.engines.quality_set import load as load_quality_set  # noqa: E402
from batchserve.engines.quality_set import read as read_quality_set  # noqa: E402
from batchserve.engines.runners import ExportedRunner  # noqa: E402
from batchserve.engines.runtime import Runtime  # noqa: E402
from batchserve.engines.verdict import Trial, Verdict, pick  # noqa: E402
from batchserve.errors import ConfigError  # noqa: E402
from batchserve.models.kinds import EMBEDDING  # noqa: E402
from batchserve.subpasses import GRID  # noqa: E402

MIXED = [
    "Hi",
    "  The quick brown fox jumps over the lazy dog.  ",
    "Dynamic batching groups requests that arrive close together into one forward pass.",
    "ünïcödé and emoji ✓ 🚀 mixed in",
    " ".join(["a very long text that will be truncated at the model's maximum length"] * 40),
    "x",
]


@pytest.fixture(scope="module")
def cache(engine_cache: Path) -> Path:
    return engine_cache


@pytest.fixture(scope="module")
def torch_model() -> EngineModel:
    return builtin(Runtime(device="cpu"))


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_fp32_exports_answer_what_torch_answers(
    backend: str,
    cache: Path,
    torch_model: EngineModel,
    small_quality_set: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Where the CPU computes in bfloat16, openvino runs it and is gated at load: on the
    # small set (the full one costs half a minute of reference vectors).
    monkeypatch.setenv("BATCHSERVE_QUALITY_SET", str(small_quality_set))
    model = load_model(f"minilm:backend={backend},cache_dir={cache}")
    emb = model.fn
    assert isinstance(emb, EngineModel)
    assert isinstance(emb.runner, ExportedRunner)
    assert (model.kind, model.dimension, model.max_input_tokens) == (EMBEDDING, 384, 256)
    got, counts = emb.embed(MIXED)
    want, want_counts = torch_model.embed(MIXED)
    assert got.dtype == np.float32
    assert got.shape == (len(MIXED), 384)
    assert np.all(np.sum(got * want, axis=1) >= 0.9999)
    assert counts == want_counts
    assert emb.count_tokens(["never seen before", *MIXED[:2]]) == torch_model.count_tokens(
        ["never seen before", *MIXED[:2]]
    )
    # a text's embedding does not depend on its batch
    alone = np.stack([emb([t])[0] for t in MIXED])
    assert np.all(np.sum(alone * got, axis=1) >= 0.9999)
    with pytest.raises(TypeError, match="input 1 must be a string"):
        emb(["ok", 3])
    assert emb([]).shape == (0, 384)
    # OpenVINO compiles per shape: its passes ran on the grid's shapes, and say how many.
    shapes = emb.statistics().shapes
    assert (emb.runner.grid, shapes is not None) == (
        (GRID, True) if backend == "openvino" else (None, False)
    )


def test_an_export_is_made_once_and_then_read_from_the_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = export.ensure_exported(builtin_path(), "onnx", cache)

    def no_second_export(*args: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(export, "_export_onnx", no_second_export)
    again = export.ensure_exported(builtin_path(), "onnx", cache)
    assert again == first
    assert first.model_file.name == "model.onnx"
    assert first.model_file.is_file()
    assert first.folder.name == f"onnx-r{export.RECIPE}"
    meta = json.loads((first.folder / "export.json").read_text())
    assert meta["source_sha256"] == export.model_key(builtin_path())
    assert meta["source_sha256"][:16] in first.folder.parent.name


def test_two_racing_exports_build_once_and_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real = export._export_onnx

    def counted(source: Path, path: Path) -> None:
        calls.append(path)
        real(source, path)

    monkeypatch.setattr(export, "_export_onnx", counted)
    results: list[export.Exported] = []
    errors: list[BaseException] = []

    def racer() -> None:
        try:
            results.append(export.ensure_exported(builtin_path(), "onnx", tmp_path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert len(calls) == 1
    assert results[0] == results[1]
    leftovers = [p.name for p in results[0].folder.parent.iterdir() if "-tmp-" in p.name]
    assert leftovers == []


def test_the_leftovers_of_a_crashed_export_are_replaced(cache: Path, tmp_path: Path) -> None:
    done = export.ensure_exported(builtin_path(), "onnx", cache)
    # a copy of the cache where the export never finished: no marker, a temp folder beside
    parent = tmp_path / done.folder.parent.name
    shutil.copytree(done.folder, parent / done.folder.name)
    (parent / done.folder.name / "export.json").unlink()
    (parent / done.folder.name / "model.onnx").write_bytes(b"truncated")
    (parent / ".onnx-tmp-crashed").mkdir()
    again = export.ensure_exported(builtin_path(), "onnx", tmp_path)
    assert again.folder == parent / done.folder.name
    assert (again.folder / "export.json").is_file()
    assert again.model_file.stat().st_size == done.model_file.stat().st_size
    assert not (parent / ".onnx-tmp-crashed").exists()


def test_int8_is_gated_auto_refuses_it_on_invariance_and_a_failed_gate_refuses_to_load(
    cache: Path,
    tmp_path: Path,
    small_quality_set: Path,
    monkeypatch: pytest.MonkeyPatch,
    torch_model: EngineModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("BATCHSERVE_QUALITY_SET", str(small_quality_set))
    qs = read_quality_set(small_quality_set)
    int8 = export.ensure_exported(builtin_path(), "onnx-int8", cache)
    graph = onnx.load(str(int8.model_file), load_external_data=False).graph
    ops = [node.op_type for node in graph.node]
    # six blocks: fused attention and three linear layers each, two layers left in fp32
    assert (ops.count("QAttention"), ops.count("MatMulInteger")) == (6, 16)
    emb = load_model(f"minilm:backend=onnx-int8,threads=1,cache_dir={cache}").fn
    assert isinstance(emb, EngineModel)
    assert isinstance(emb.runner, ExportedRunner)
    assert (emb.threads, emb.dtype) == (1, "int8")
    assert emb(["int8 still embeds"]).shape == (1, 384)
    assert "--backend auto would not choose it: batch invariance" in caplog.text
    # the gate ran once, on the set named, and its figures are kept: the meaning is kept
    # (served by name), but the vector of a text depends on its batch-mates (dynamic int8
    # takes its activation scales per pass), which auto never serves
    record = next((int8.folder.parent / "gate").glob(f"onnx-int8-int8-{set_digest(qs)}.json"))
    figures = json.loads(record.read_text())
    assert figures["texts"] == len(qs.texts)
    assert figures["mean_cosine"] >= 0.99
    assert figures["servable"]
    assert figures["invariance"] < MIN_INVARIANCE
    assert not figures["passes"]
    quality = Quality.from_dict(figures)
    assert "invariance" in quality.failed_bounds()
    reference = gate(builtin_path(), REFERENCE, torch_model, cache, quality_set=qs)
    assert reference.invariance >= MIN_INVARIANCE
    trials = [
        Trial(engine=REFERENCE, items_per_s=10.0, quality=reference),
        Trial(engine=Engine("onnx-int8", "int8"), items_per_s=30.0, quality=quality),
    ]
    assert pick(trials) == REFERENCE  # three times faster, and refused on invariance alone
    verdict = Verdict(
        chosen=pick(trials), device="cpu", batch_size=32, threads=1, workers=1,
        trials=tuple(trials), machine={}, versions={}, key="k", seconds=1.0, created="now",
    )  # fmt: skip
    row = next(line for line in verdict.table().splitlines() if line.startswith("onnx-int8"))
    assert f"{quality.invariance:9.6f}" in row
    assert "FAIL: invariance" in row

    # the same export, its figures made to fail: the load says why and what to use
    failed = tmp_path / int8.folder.parent.name
    shutil.copytree(int8.folder, failed / int8.folder.name)
    (failed / "gate").mkdir()
    figures.update(mean_cosine=0.966, passes=False, servable=False)
    (failed / "gate" / record.name).write_text(json.dumps(figures))
    with pytest.raises(ConfigError, match="at int8 failed the quality gate") as info:
        load_model(f"minilm:backend=onnx-int8,cache_dir={tmp_path}")
    assert "mean cosine to fp32 must be >= 0.99, got 0.9660" in str(info.value)


def test_exported_backends_refuse_a_gpu_and_unknown_backends() -> None:
    with pytest.raises(ConfigError, match="runs on the CPU here"):
        load_model("minilm:backend=onnx,device=cuda")
    with pytest.raises(ConfigError, match="backend must be onnx, onnx-int8"):
        export.ensure_exported(builtin_path(), "torch", Path("/nonexistent"))


# OpenVINO's invariance on its grid of shapes is checked above (alone vs in a batch) and by
# the gate at load; the shipped set's 64 probes would compile a shape each (over a minute).
@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_fp32_answers_do_not_depend_on_batch_mates(
    backend: str, cache: Path, torch_model: EngineModel
) -> None:
    # the shipped texts, from one word to the longest passages, alone and in random batches
    fn: EngineModel = torch_model
    if backend != "torch":
        fn = on_exported(builtin_path(), Runtime(backend=backend, cache_dir=str(cache)))
    worst, probes = invariance(fn, load_quality_set().texts)
    assert probes == 64
    assert worst >= MIN_INVARIANCE
