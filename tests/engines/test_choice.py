"""``--backend auto``: the pure choice, and the measurement driven with fake engines.

The fake engines cost a known time per text (a sleep, which releases the GIL as a real
engine's pass does), so their measured order is certain on a busy machine: each is at least
2.5x apart from the next, and a pass lasts milliseconds, far above a thread's start. Their
quality figures are put in the gate's cache beforehand, and their figures on the model's
edge texts are what :func:`edge_figures` says (the fakes are no model for sentence-transformers
to hold them to), so no real model runs here; the real engines (the float32 ones) are
chosen end to end in ``tests/server/test_engine_choice.py``, and every engine of the zoo's
folders is held to the library in ``tests/engines/test_zoo.py``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchserve.engines import edges
from batchserve.engines.choice import choose, cpu_share
from batchserve.engines.export import model_folder
from batchserve.engines.gate import set_digest
from batchserve.engines.hardware import REFERENCE, Engine, Machine
from batchserve.engines.quality import MIN_INVARIANCE, Quality
from batchserve.engines.quality_set import QualitySet
from batchserve.engines.ranking_gate import SequenceJudge, SequenceVerdict, score_similarity
from batchserve.engines.verdict import BUSY_SHARE, Trial, Verdict, gate_order, pick
from batchserve.errors import ConfigError
from batchserve.models.kinds import CLASSIFIER, RERANKER

EPYC = Machine(cpu_model="AMD EPYC", cpu_flags=frozenset({"avx2", "fma"}), cores=2)
ALL = {"torch", "onnx", "onnx-int8", "openvino", "openvino-int8"}
GOOD = Quality(texts=10, mean_cosine=0.99999, min_cosine=0.99995, queries=4, ranking_agreement=1.0)
BAD = Quality(texts=10, mean_cosine=0.95, min_cosine=0.80, queries=4, ranking_agreement=0.75)
QS = QualitySet(
    texts=tuple(f"text number {i} " + "word " * (i % 7) for i in range(24)),
    queries=("a query",),
    passages=("a passage", "another"),
)


#: Each engine's figures on the edge texts, by backend (absent: every text at cosine 1).
EDGE_COSINE: dict[str, tuple[float, str]] = {}


@pytest.fixture(autouse=True)
def edge_figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[float, str]]:
    """The fakes' figures on the edge texts, set per test in the returned table."""
    EDGE_COSINE.clear()

    def check(source: Path, engine: Engine, candidate: Any, cache: Path, **_: Any) -> edges.Edges:
        cosine, worst = EDGE_COSINE.get(engine.backend, (1.0, "the empty string"))
        return edges.Edges(
            texts=20,
            min_cosine=cosine,
            worst=worst,
            norm_error=0.0,
            floor=edges.cosine_floor(engine.dtype),
            norm_bound=edges.norm_bound(engine.dtype),
        )

    monkeypatch.setattr(edges, "check", check)
    return EDGE_COSINE


def trial(backend: str, dtype: str, rate: float | None, quality: Quality | None = None) -> Trial:
    return Trial(engine=Engine(backend, dtype), items_per_s=rate, quality=quality)


def test_pick_serves_the_fastest_engine_that_passed() -> None:
    trials = [
        trial("torch", "float32", 10.0),
        trial("onnx-int8", "int8", 30.0, BAD),
        trial("openvino", "float32", 20.0, GOOD),
        trial("onnx", "float32", 25.0),  # not gated: not eligible
    ]
    assert pick(trials) == Engine("openvino", "float32")
    assert gate_order(trials) == [
        Engine("onnx-int8", "int8"),
        Engine("onnx", "float32"),
        Engine("openvino", "float32"),
    ]


def test_pick_never_serves_an_engine_whose_vectors_depend_on_the_batch() -> None:
    # the meaning kept, the neighbours kept, but a text alone and in a batch part: dynamic int8
    varies = dataclasses.replace(
        GOOD, neighbours=100, nearest_kept=0.99, top10_overlap=0.98, invariance=0.986, probes=64
    )
    assert varies.servable
    assert varies.failed_bounds() == ["invariance"]
    trials = [trial("torch", "float32", 10.0), trial("onnx-int8", "int8", 30.0, varies)]
    assert pick(trials) == REFERENCE
    steady = dataclasses.replace(varies, invariance=0.99995)
    assert pick([*trials, trial("openvino-int8", "int8", 20.0, steady)]) == Engine(
        "openvino-int8", "int8"
    )
    verdict = Verdict(
        chosen=REFERENCE, device="cpu", batch_size=32, threads=1, workers=1,
        trials=tuple(trials), machine={}, versions={}, key="k", seconds=1.0, created="now",
    )  # fmt: skip
    header, ref_row, int8_row = verdict.table().splitlines()[:3]
    for column in ("mean cos", "min cos", "QA kept", "NN kept", "top-10", "invariant"):
        assert column in header
    assert ref_row.endswith("reference")
    assert "0.986000  FAIL: invariance" in int8_row
    assert " 99.0% " in int8_row


def test_pick_falls_back_to_the_reference() -> None:
    assert pick([trial("torch", "float32", 10.0), trial("onnx", "float32", 30.0, BAD)]) == (
        REFERENCE
    )
    assert pick([]) == REFERENCE
    # an engine slower than the reference is never worth gating
    assert gate_order([trial("torch", "float32", 10.0), trial("onnx", "float32", 9.0)]) == []


@given(
    st.floats(1.0, 100.0),
    st.lists(st.tuples(st.floats(1.0, 100.0), st.sampled_from([None, True, False])), max_size=6),
)
def test_auto_never_serves_an_engine_measured_slower_than_torch_fp32(
    ref: float, others: list[tuple[float, bool | None]]
) -> None:
    trials = [trial("torch", "float32", ref)]
    for i, (rate, passes) in enumerate(others):
        quality = None if passes is None else (GOOD if passes else BAD)
        trials.append(trial(f"engine{i}", "int8", rate, quality))
    chosen = pick(trials)
    chosen_rate = next(t.items_per_s for t in trials if t.engine == chosen)
    assert chosen_rate is not None
    assert chosen_rate >= ref
    assert chosen == REFERENCE or next(t for t in trials if t.engine == chosen).gated


class Fake:
    """An engine whose pass costs ``per_item_s`` per text (a sleep: the GIL is free)."""

    def __init__(self, per_item_s: float) -> None:
        self.per_item_s = per_item_s
        self.calls = 0

    def __call__(self, texts: Sequence[str]) -> Any:
        self.calls += 1
        time.sleep(self.per_item_s * len(texts))
        return np.ones((len(texts), 4), dtype=np.float32)


def seed_gate(source: Path, cache: Path, engine: Engine, quality: Quality) -> None:
    folder = model_folder(source, cache) / "gate"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{engine.backend}-{engine.dtype}-{set_digest(QS)}.json"
    (folder / name).write_text(json.dumps(quality.to_dict()))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"not a real model")
    return folder


def test_choose_measures_gates_fastest_first_and_caches(source: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fakes = {
        Engine("torch", "float32"): Fake(0.010),
        Engine("onnx", "float32"): Fake(0.030),  # slower than torch: never gated
        Engine("onnx-int8", "int8"): Fake(0.001),  # fastest, fails its gate
        Engine("openvino", "float32"): Fake(0.004),  # second, passes
    }
    loaded: list[Engine] = []

    def load(engine: Engine) -> Any:
        loaded.append(engine)
        if engine not in fakes:
            raise ImportError("openvino-int8 needs nncf")
        return fakes[engine]

    seed_gate(source, cache, Engine("onnx-int8", "int8"), BAD)
    seed_gate(source, cache, Engine("openvino", "float32"), GOOD)
    kwargs: dict[str, Any] = {
        "device": "cpu",
        "threads": 1,
        "workers": 2,
        "batch_size": 4,
        "cache_dir": cache,
        "load": load,
        "machine": EPYC,
        "installed": ALL,
        "quality_set": QS,
        "rounds": 1,
        "repeats": 1,
    }
    verdict, fn = choose(source, **kwargs)
    assert verdict.chosen == Engine("openvino", "float32")
    assert fn is fakes[Engine("openvino", "float32")]
    assert not verdict.cached
    by = {str(t.engine): t for t in verdict.trials}
    # no bfloat16 on this CPU: not loaded, and the table says why
    assert "lacks" in (by["torch/bfloat16"].unavailable or "")
    assert "failed to load: openvino-int8 needs nncf" in (
        by["openvino-int8/int8"].unavailable or ""
    )
    assert by["onnx-int8/int8"].gated is False
    assert by["openvino/float32"].gated is True
    assert by["onnx/float32"].gated is None
    assert by["torch/float32"].gated is True
    # the reference is gated against itself: only its invariance is measured
    ref_quality = by["torch/float32"].quality
    assert isinstance(ref_quality, Quality)
    assert (ref_quality.invariance, ref_quality.probes) == (1.0, len(QS.texts))
    rates = {k: t.items_per_s for k, t in by.items() if t.items_per_s}
    assert rates["onnx-int8/int8"] > rates["openvino/float32"] > rates["torch/float32"]
    assert rates["torch/float32"] > rates["onnx/float32"]
    assert (verdict.speedup() or 0.0) > 1
    table = verdict.table()
    assert "openvino/float32 *" in table
    assert "FAIL" in table
    assert "reference" in table
    assert "openvino/float32" in verdict.summary()
    assert "measured" in verdict.summary()

    # the next start reads the verdict and loads nothing while choosing
    loaded.clear()
    again, fn = choose(source, **kwargs)
    assert (again.chosen, again.cached, fn, loaded) == (verdict.chosen, True, None, [])
    assert again.trials == verdict.trials
    # another batch size, another machine or refresh=True measure again
    other = Machine(cpu_model="AMD EPYC", cpu_flags=frozenset({"avx2"}), cores=8)
    assert not choose(source, **{**kwargs, "machine": other})[0].cached
    assert not choose(source, **{**kwargs, "batch_size": 8})[0].cached
    assert not choose(source, **kwargs, refresh=True)[0].cached


def torch_only(cache: Path) -> dict[str, Any]:
    """choose()'s arguments for a machine with only torch installed, a fast fake engine."""
    return {
        "device": "cpu",
        "threads": 1,
        "workers": 1,
        "batch_size": 4,
        "cache_dir": cache,
        "load": lambda engine: Fake(0.0005),
        "machine": EPYC,
        "installed": {"torch"},
        "quality_set": QS,
        "rounds": 1,
        "repeats": 1,
    }


class Varying(Fake):
    """A fast engine whose vectors depend on the batch (as dynamic int8's do)."""

    def __call__(self, texts: Sequence[str]) -> Any:
        super().__call__(texts)
        out = np.ones((len(texts), 4), dtype=np.float32)
        out[:, 0] = len(texts)
        return out


def test_an_engine_whose_vectors_depend_on_the_batch_is_screened_out_before_its_gate(
    source: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    fakes = {
        Engine("torch", "float32"): Fake(0.010),
        Engine("onnx-int8", "int8"): Varying(0.001),  # fastest, its answers vary
        Engine("onnx", "float32"): Fake(0.004),  # second, passes
    }
    seed_gate(source, cache, Engine("onnx", "float32"), GOOD)
    kwargs = torch_only(cache) | {
        "load": fakes.__getitem__,
        "installed": {"torch", "onnx", "onnx-int8"},
    }
    verdict, _ = choose(source, **kwargs)
    assert verdict.chosen == Engine("onnx", "float32")
    by = {str(t.engine): t for t in verdict.trials}
    int8 = by["onnx-int8/int8"]
    assert int8.screened_out
    assert int8.invariance is not None
    assert int8.invariance < 0.9999
    assert (int8.quality, int8.gated) == (None, False)  # refused without the full gate
    gates = model_folder(source, cache) / "gate"
    assert not list(gates.glob("onnx-int8-*.json"))
    assert by["onnx/float32"].invariance == pytest.approx(1.0)
    row = next(line for line in verdict.table().splitlines() if line.startswith("onnx-int8"))
    assert f"{int8.invariance:9.6f}  FAIL: invariance" in row
    again, _ = choose(source, **kwargs)
    assert again.cached
    assert again.trials == verdict.trials


def test_an_engine_that_misses_the_library_on_one_edge_text_is_not_chosen(
    source: Path, tmp_path: Path
) -> None:
    # The fastest engine keeps every text of the set but cuts a long text at 512 tokens.
    cache = tmp_path / "cache"
    fakes = {
        Engine("torch", "float32"): Fake(0.010),
        Engine("onnx", "float32"): Fake(0.002),  # fastest: wrong past 512 tokens
        Engine("openvino", "float32"): Fake(0.004),  # second: right everywhere
    }
    cut = edges.Edges(
        texts=20, min_cosine=0.18, worst="a text longer than the window (1309 tokens, window "
        "8192)", norm_error=0.0, floor=0.9999, norm_bound=1e-3,
    )  # fmt: skip
    seed_gate(source, cache, Engine("onnx", "float32"), dataclasses.replace(GOOD, edges=cut))
    seed_gate(source, cache, Engine("openvino", "float32"), GOOD)
    kwargs = torch_only(cache) | {
        "load": fakes.__getitem__,
        "installed": {"torch", "onnx", "openvino"},
    }
    verdict, _ = choose(source, **kwargs)
    assert verdict.chosen == Engine("openvino", "float32")
    onnx = verdict.trial(Engine("onnx", "float32"))
    assert onnx is not None
    assert isinstance(onnx.quality, Quality)
    assert onnx.gated is False
    assert onnx.quality.failed_bounds() == ["edges"]
    assert onnx.quality.failures() == [
        "cosine to sentence-transformers on a text longer than the window (1309 tokens, "
        "window 8192) must be >= 0.9999, got 0.1800"
    ]
    row = next(line for line in verdict.table().splitlines() if line.startswith("onnx/"))
    assert "0.180000 " in row
    assert row.endswith("FAIL: edges")


def test_a_folder_the_reference_itself_misses_is_refused_with_the_text(
    source: Path, tmp_path: Path, edge_figures: dict[str, tuple[float, str]]
) -> None:
    edge_figures["torch"] = (0.62, "a query with prompt 'query'")
    with pytest.raises(ConfigError) as info:
        choose(source, **torch_only(tmp_path / "cache"))
    assert "no engine gives this folder's vectors as sentence-transformers does" in str(info.value)
    assert "on a query with prompt 'query' must be >= 0.9999, got 0.6200" in str(info.value)


def test_a_damaged_verdict_is_measured_again(source: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    kwargs = torch_only(cache)
    verdict, _ = choose(source, **kwargs)
    assert verdict.chosen == REFERENCE  # the only engine installed
    path = model_folder(source, cache) / "auto" / f"{verdict.key}.json"
    path.write_text("{not json")
    again, _ = choose(source, **kwargs)
    assert not again.cached
    assert Verdict.from_dict(json.loads(path.read_text())).chosen == REFERENCE
    with pytest.raises(ValueError, match="verdict format"):
        Verdict.from_dict({**verdict.to_dict(), "format": 99})


def test_the_cpu_share_is_what_the_process_got_of_the_cores_it_asked_for() -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    time.sleep(0.2)
    assert cpu_share(wall, cpu, 1) < 0.5  # asleep: no CPU used (bound generous)
    wall, cpu = time.perf_counter(), time.process_time()
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        pass
    # one thread spinning: nearly one core (bound generous: the machine may be busy), and
    # about half of two
    assert cpu_share(wall, cpu, 1) > 0.3
    assert cpu_share(wall, cpu, 2) < 0.75


def test_a_verdict_timed_while_other_work_held_the_cores_says_so(
    source: Path, tmp_path: Path
) -> None:
    # the fake engine sleeps: its passes use none of the CPU they ask for, as when another
    # process holds the cores
    verdict, _ = choose(source, **torch_only(tmp_path))
    assert verdict.cpu_share is not None
    assert verdict.cpu_share < BUSY_SHARE
    assert verdict.busy()
    summary = verdict.summary()
    assert "timed while other work held the CPU" in summary
    assert "measure again when the machine is quiet (batchserve profile --backends" in summary
    # the share is kept with the verdict: a later start reads it and says so too
    again, _ = choose(source, **torch_only(tmp_path))
    assert (again.cached, again.cpu_share, again.busy()) == (True, verdict.cpu_share, True)
    assert verdict.to_dict()["cpu_share"] == verdict.cpu_share
    quiet = dataclasses.replace(verdict, cpu_share=0.81)
    assert not quiet.busy()
    assert "other work" not in quiet.summary()
    # a verdict from before the share was kept (or timed on a GPU) says nothing of it
    old = {k: v for k, v in verdict.to_dict().items() if k != "cpu_share"}
    assert Verdict.from_dict(old).cpu_share is None
    assert not Verdict.from_dict(old).busy()


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_start(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    folder = model_folder(source, cache)
    folder.mkdir(parents=True)
    (folder / "auto").write_text("a file where the verdicts' folder should be")
    kwargs = torch_only(cache)
    verdict, fn = choose(source, **kwargs)
    assert verdict.chosen == REFERENCE
    assert fn is not None
    assert "could not keep" in caplog.text
    assert not choose(source, **kwargs)[0].cached  # measured again, as the warning says


class Scorer(Fake):
    """A reranker engine: a pair's logit is its passage's length over 10 (``sign`` -1 reverses
    the ranking), plus ``drift`` times the batch's size (its scores depend on the batch)."""

    def __init__(self, per_item_s: float, *, sign: float = 1.0, drift: float = 0.0) -> None:
        super().__init__(per_item_s)
        self.sign, self.drift = sign, drift

    def __call__(self, items: Sequence[Any]) -> Any:
        super().__call__(items)
        return np.asarray(
            [[self.sign * len(p) / 10 + self.drift * len(items)] for _, p in items],
            dtype=np.float32,
        )


RANKED = QualitySet(
    texts=QS.texts,
    queries=("a query", "another query"),
    passages=tuple("passage " + "word " * i for i in range(12)),
)


def test_a_rerankers_engines_are_timed_on_pairs_and_gated_by_the_ranking_they_keep(
    source: Path, tmp_path: Path
) -> None:
    fakes = {
        Engine("torch", "float32"): Scorer(0.010),
        Engine("onnx-int8", "int8"): Scorer(0.001, drift=0.01),  # fastest, batch-dependent
        Engine("openvino", "float32"): Scorer(0.002, sign=-1.0),  # second, ranking reversed
        Engine("onnx", "float32"): Scorer(0.004),  # third, keeps the ranking
    }
    kwargs = torch_only(tmp_path / "cache") | {
        "load": fakes.__getitem__,
        "installed": {"torch", "onnx", "onnx-int8", "openvino"},
        "quality_set": RANKED,
        "judge": SequenceJudge(RERANKER, RANKED),
        "machine": EPYC,
    }
    verdict, fn = choose(source, **kwargs)
    assert (verdict.kind, verdict.chosen) == (RERANKER, Engine("onnx", "float32"))
    assert fn is fakes[Engine("onnx", "float32")]
    # every engine was timed on (query, passage) pairs of the reference manual's paragraphs
    timed = fakes[Engine("torch", "float32")]
    assert timed.calls > 0
    by = {str(t.engine): t for t in verdict.trials}
    assert by["onnx-int8/int8"].screened_out
    assert by["onnx-int8/int8"].quality is None
    reversed_ = by["openvino/float32"].quality
    assert isinstance(reversed_, SequenceVerdict)
    assert reversed_.failed_bounds() == ["Spearman", "top", "score", "order"]
    assert by["onnx/float32"].gated is True
    assert by["torch/float32"].invariance == pytest.approx(1.0)
    table = verdict.table()
    assert table.splitlines()[0].split()[:2] == ["engine", "pairs/s"]
    assert "FAIL: Spearman, top, score, order" in table
    assert "onnx/float32 *" in table
    # the verdict and its figures are read back from the cache as they were written
    again, fn = choose(source, **kwargs)
    assert (again.cached, again.kind, fn) == (True, RERANKER, None)
    assert again.trials == verdict.trials
    # a classifier's verdict of the same folder would be another
    assert SequenceJudge(CLASSIFIER, RANKED).key() != SequenceJudge(RERANKER, RANKED).key()


def test_a_score_that_moves_with_its_batch_mates_fails_the_invariance_screen() -> None:
    judge = SequenceJudge(RERANKER, RANKED)
    assert judge.screen(Scorer(0.0), batch_size=4) == pytest.approx(1.0)
    assert judge.screen(Scorer(0.0, drift=0.001), batch_size=4) < MIN_INVARIANCE
    similarity = score_similarity(CLASSIFIER)
    alone = np.array([[0.0, 0.0], [2.0, 0.0]], dtype=np.float32)
    assert similarity(alone, alone).tolist() == [1.0, 1.0]
    moved = similarity(alone, alone + np.array([[0.0, 0.01], [0.0, 0.0]], dtype=np.float32))
    assert moved[0] == pytest.approx(1 - 0.0025, abs=1e-4)
    assert moved[1] == 1.0
