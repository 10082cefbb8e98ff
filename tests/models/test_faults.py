"""The fault-injecting model: each fault does what its variable says, and only that."""

from __future__ import annotations

import json
import pathlib
import threading
import time

import pytest

from batchserve.config import CostEstimate
from batchserve.errors import ConfigError
from batchserve.models.faults import FaultyModel, crashes_on
from batchserve.models.kinds import EMBEDDING
from batchserve.models.loader import load_model
from batchserve.models.synthetic import SyntheticModel

pytestmark = pytest.mark.reliability

FREE = {"BATCHSERVE_FAULT_COST": "fixed=0ms,per_item=0ms,dim=4"}


def test_a_healthy_faulty_model_is_the_synthetic_model() -> None:
    model = FaultyModel(FREE)
    assert model([" a", "b"]) == SyntheticModel(0, 0, dimension=4)([" a", "b"])
    assert model.initial_cost == CostEstimate(fixed_s=0.0, per_item_s=0.0)


def test_the_loader_serves_it_as_an_embedding_model_with_its_stated_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATCHSERVE_FAULT_COST", "fixed=3ms,per_item=1ms,dim=6")
    loaded = load_model("batchserve.models.faults:FaultyModel")
    assert (loaded.kind, loaded.dimension) == (EMBEDDING, 6)
    assert loaded.initial_cost == CostEstimate(fixed_s=0.003, per_item_s=0.001)


def test_poison_fails_only_the_passes_that_hold_it() -> None:
    model = FaultyModel({**FREE, "BATCHSERVE_FAULT_POISON": "bad"})
    assert len(model(["a", "b"])) == 2
    with pytest.raises(ValueError, match="'bad'"):
        model(["a", "bad", "c"])


def test_crashing_inputs_are_a_seeded_fraction_and_stay_bad() -> None:
    texts = [f"t{i}" for i in range(4000)]
    bad = [t for t in texts if crashes_on(t, 0.05, seed=7)]
    assert 0.04 * len(texts) < len(bad) < 0.06 * len(texts)  # binomial: sd is 0.0034
    assert bad == [t for t in texts if crashes_on(t, 0.05, seed=7)]
    assert bad != [t for t in texts if crashes_on(t, 0.05, seed=8)]
    model = FaultyModel(
        {**FREE, "BATCHSERVE_FAULT_CRASH_RATE": "0.05", "BATCHSERVE_FAULT_SEED": "7"}
    )
    for _ in range(2):
        with pytest.raises(RuntimeError, match="crashed"):
            model(["fine", bad[0]])
    good = [t for t in texts if t not in set(bad)][:50]
    assert len(model(good)) == 50


def test_flaky_passes_fail_at_their_rate_whatever_they_hold() -> None:
    model = FaultyModel({**FREE, "BATCHSERVE_FAULT_FLAKY_RATE": "0.2"})
    failures = 0
    for _ in range(1000):
        try:
            model(["same"])
        except RuntimeError:
            failures += 1
    assert 150 < failures < 250  # binomial: sd is 12.6


def test_the_record_holds_every_pass_it_was_handed(tmp_path: pathlib.Path) -> None:
    record = tmp_path / "seen.jsonl"
    model = FaultyModel(
        {**FREE, "BATCHSERVE_FAULT_RECORD": str(record), "BATCHSERVE_FAULT_POISON": "p"}
    )
    model(["a", "b"])
    with pytest.raises(ValueError, match="cannot embed"):
        model(["p"])
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert lines == [["a", "b"], ["p"]]


def test_a_stall_file_holds_passes_until_it_goes(tmp_path: pathlib.Path) -> None:
    stall = tmp_path / "stall"
    model = FaultyModel({**FREE, "BATCHSERVE_FAULT_STALL_FILE": str(stall)})
    t0 = time.monotonic()
    model(["free"])
    assert time.monotonic() - t0 < 0.1
    stall.touch()
    t0 = time.monotonic()  # before the timer starts: it counts its 0.2 s from its start
    threading.Timer(0.2, stall.unlink).start()
    model(["stuck"])
    took = time.monotonic() - t0
    assert 0.2 <= took < 2.0  # tolerance: thread start and the 5 ms poll, on a busy machine
    stall.write_text("50ms")
    t0 = time.monotonic()
    model(["slow"])
    assert 0.05 <= time.monotonic() - t0 < 1.0


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"BATCHSERVE_FAULT_CRASH_RATE": "2"}, "CRASH_RATE must be a number in [0, 1], got '2'"),
        ({"BATCHSERVE_FAULT_FLAKY_RATE": "x"}, "FLAKY_RATE must be a number in [0, 1]"),
        ({"BATCHSERVE_FAULT_SEED": "1.5"}, "SEED must be an integer, got '1.5'"),
        ({"BATCHSERVE_FAULT_COST": "dim=0"}, "must not set dim=0"),
        ({"BATCHSERVE_FAULT_COST": "speed=1"}, "unknown synthetic model option 'speed'"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        FaultyModel(env)
