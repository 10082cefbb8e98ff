from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from batchserve.bisection import Bisector, run_sync
from batchserve.errors import ModelError, OutputMismatch


def failing_on(bad: set[int]):  # type: ignore[no-untyped-def]
    calls: list[list[int]] = []

    def model(xs: Sequence[int]) -> list[int]:
        calls.append(list(xs))
        if bad & set(xs):
            raise ValueError(f"bad in {list(xs)}")
        return [x * 10 for x in xs]

    return model, calls


def test_no_failure_is_one_call() -> None:
    model, calls = failing_on(set())
    r = run_sync(model, [1, 2, 3], None)
    assert r.outputs == [10, 20, 30]
    assert r.errors == {}
    assert r.extra_calls == 0
    assert calls == [[1, 2, 3]]


def test_isolates_a_single_bad_input() -> None:
    model, calls = failing_on({3})
    r = run_sync(model, [0, 1, 2, 3, 4, 5, 6, 7], None)
    assert set(r.errors) == {3}
    assert isinstance(r.errors[3], ModelError)
    assert isinstance(r.errors[3].__cause__, ValueError)
    assert [o for i, o in enumerate(r.outputs) if i != 3] == [0, 10, 20, 40, 50, 60, 70]
    # log2(8) levels, two calls each: at most 6 extra calls for one bad input.
    assert r.extra_calls == len(calls) - 1 <= 6


@given(st.integers(1, 40), st.sets(st.integers(0, 39), max_size=6))
def test_every_good_input_answered_every_bad_one_failed(n: int, bad: set[int]) -> None:
    bad = {b for b in bad if b < n}
    model, calls = failing_on(bad)
    r = run_sync(model, list(range(n)), None)
    assert set(r.errors) == bad
    for i in range(n):
        if i not in bad:
            assert r.outputs[i] == i * 10
    assert r.extra_calls <= 2 * n
    assert r.extra_calls == len(calls) - 1


def test_budget_exhausted_fails_the_rest_of_the_span() -> None:
    model, _calls = failing_on({0})
    r = run_sync(model, list(range(8)), 2)
    assert r.extra_calls <= 2
    assert 0 in r.errors
    assert len(r.errors) > 1


def test_length_mismatch_is_not_bisected() -> None:
    plan = Bisector(3)
    span = plan.next_span()
    assert span == (0, 3)
    plan.succeeded(span, [1])
    assert plan.next_span() is None
    assert all(isinstance(e, OutputMismatch) for e in plan.result.errors.values())
    plan2 = Bisector(2)
    s2 = plan2.next_span()
    assert s2 is not None
    plan2.succeeded(s2, "ab")  # a string is not a list of outputs
    assert set(plan2.result.errors) == {0, 1}
