"""Scenarios 2 and 3: a model that raises, mixed into steady load.

Batches collect for up to 10 ms at 400 requests/s, so a failing input shares its pass with
good ones. The model records every pass it is handed, so the test can see which inputs
shared a pass with a failing one. No timing is asserted here beyond the 2 s deadline.
"""

from __future__ import annotations

import pathlib

import pytest

from batchserve.models.faults import crashes_on
from batchserve_testing.harness import unique_texts
from batchserve_testing.scenarios import failing_model

pytestmark = [pytest.mark.reliability, pytest.mark.slow]


def test_poison_fails_only_its_own_requests(tmp_path: pathlib.Path) -> None:
    n = 1601
    texts = list(unique_texts(n))
    for i in range(7, n, 20):  # one request in twenty carries the poison
        texts[i] = "poison"
    f = failing_model(
        tmp_path,
        fault_env={"BATCHSERVE_FAULT_POISON": "poison"},
        texts=texts,
        duration_s=4.0,
        rate=400.0,
        scenario="poison",
    )
    run, counts = f.run, f.counts
    assert run is not None
    assert counts is not None
    poisoned = [i for i in range(run.n) if run.text(i) == "poison"]
    clean = [i for i in range(run.n) if run.text(i) != "poison"]
    assert len(poisoned) == 80
    # Only the requests holding the poison fail, with 422 and the model's reason.
    assert all(run.status[i] == 422 and run.reason(i) == "model_error" for i in poisoned)
    assert [i for i in clean if run.status[i] != 200] == []
    # Every other request in the same batches succeeded: the passes that held the poison
    # with good inputs were many, and each of those good inputs was answered 200.
    record = f.extra["record"]
    mixed = [batch for batch in record if "poison" in batch and len(batch) > 1]
    assert len(mixed) >= 20, f"too few mixed batches to prove anything: {len(mixed)}"
    ok_texts = {run.text(i) for i in clean}
    assert all(t in ok_texts for batch in mixed for t in batch if t != "poison")
    # The bisection is counted: every model call beyond one per batch was bisection.
    assert f.extra["bisect_calls"] == len(record) - f.extra["batches"] > 0
    assert f.extra["failed_items"] == len(poisoned) == counts["failed"]
    assert f.extra["healthy_after"]
    assert counts["ok"] == len(clean)


def test_random_crashes_fail_exactly_the_inputs_that_crash(tmp_path: pathlib.Path) -> None:
    rate, seed = 0.05, 11
    f = failing_model(
        tmp_path,
        fault_env={"BATCHSERVE_FAULT_CRASH_RATE": str(rate), "BATCHSERVE_FAULT_SEED": str(seed)},
        duration_s=4.0,
        rate=400.0,
        scenario="crash",
    )
    run, counts = f.run, f.counts
    assert run is not None
    assert counts is not None
    bad = {i for i in range(run.n) if crashes_on(run.text(i), rate, seed)}
    failed = {i for i in range(run.n) if run.status[i] == 422}
    # The error rate the clients see is the injected rate, request for request.
    assert failed == bad
    assert abs(len(bad) / run.n - rate) < 0.02  # binomial over 1,600 draws: sd 0.0055
    # Nothing else is lost: every other request succeeded, and the server kept serving.
    assert f.ok == run.n - len(bad)
    assert f.lost == 0
    assert f.extra["healthy_after"]
    assert counts["failed"] == len(bad)
    assert counts["ok"] == f.ok


def test_transient_faults_are_absorbed_by_the_retries(tmp_path: pathlib.Path) -> None:
    rate = 0.1
    f = failing_model(
        tmp_path,
        fault_env={"BATCHSERVE_FAULT_FLAKY_RATE": str(rate), "BATCHSERVE_FAULT_SEED": "5"},
        duration_s=4.0,
        rate=400.0,
        scenario="flaky",
    )
    run, counts = f.run, f.counts
    assert run is not None
    assert counts is not None
    failed = run.count(422)
    # Every request is answered 200 or 422; a 422 needs every pass on its bisection path
    # to have failed, so clients see fewer errors than the passes that raised.
    assert f.ok + failed == run.n
    assert f.lost == 0
    calls = len(f.extra["record"])
    assert f.extra["bisect_calls"] > 0
    assert failed <= rate * calls
    assert failed < rate * run.n
    assert counts["failed"] == failed
    assert f.extra["healthy_after"]
