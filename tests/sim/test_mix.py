"""Mixed traffic on virtual time: the issue's scenario, judged by the simulator's figures."""

import json

import pytest

from batchserve.cli import main
from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import ConfigError
from batchserve.policy import ClassConfig, WorkClass
from batchserve.sim.mix import Stream, parse_stream, simulate_mix
from batchserve.sim.mixtune import tune_mix

COST = CostEstimate(fixed_s=0.022, per_item_s=0.00016)  # ~1,985 items/s at batch 64
CAPACITY = 64 / COST.cost(64)
CONFIG = BatchConfig(max_batch_size=64, max_wait_s=0.002, queue_size=1024, initial_cost=COST)
CLASSES = ClassConfig(
    classes=(
        WorkClass(name="interactive", queue_share=0.25, timeout_s=0.1),
        WorkClass(name="bulk", queue_share=0.75, timeout_s=30.0, max_wait_s=0.02),
    )
)
QUERIES = Stream(work_class="interactive", rate=200, timeout_s=0.1, arrivals="poisson", seed=1)
BULK = Stream(work_class="bulk", rate=62.5, inputs=64, timeout_s=30.0, arrivals="poisson", seed=2)


def run(streams: list[Stream], classes: ClassConfig | None = CLASSES, duration_s: float = 4.0):  # type: ignore[no-untyped-def]
    return simulate_mix(
        config=CONFIG, cost=COST, streams=streams, classes=classes, duration_s=duration_s
    )


def test_classes_keep_queries_fast_beside_a_bulk_flood_and_fifo_does_not() -> None:
    alone = run([QUERIES]).streams[0]
    mixed = run([QUERIES, BULK])
    fifo = run([QUERIES, BULK], classes=None)
    q, b = mixed.streams
    assert q.rejected_total == 0
    assert q.timed_out == 0
    assert q.p99_ms <= 1.5 * alone.p99_ms
    assert b.ok_per_s >= 0.9 * (CAPACITY - q.ok_per_s)
    fq = fifo.streams[0]
    # One FIFO queue: queries wait behind the bulk queue, so most miss 100 ms or are refused.
    assert fq.ok < 0.5 * fq.sent


def test_two_flooding_tenants_each_get_half() -> None:
    classes = ClassConfig(classes=(WorkClass(name="bulk", timeout_s=30.0),), tenant_share=0.5)
    a = Stream(work_class="bulk", tenant="a", rate=125, inputs=64, arrivals="poisson", seed=3)
    b = Stream(work_class="bulk", tenant="b", rate=125, inputs=64, arrivals="poisson", seed=4)
    result = run([a, b], classes)
    total = sum(s.ok_per_s for s in result.streams)
    assert total >= 0.95 * CAPACITY
    for s in result.streams:
        assert 0.45 <= s.ok_per_s / total <= 0.55


def test_a_refused_request_withdraws_its_admitted_inputs() -> None:
    tiny = BatchConfig(max_batch_size=4, max_wait_s=0.002, queue_size=6, initial_cost=COST)
    one = ClassConfig(classes=(WorkClass(name="bulk"),))
    # Requests of 4 inputs, 1 ms apart: the first runs at once, the second waits for it,
    # the third only half fits in the queue and is refused whole.
    s = Stream(work_class="bulk", rate=1000, inputs=4, timeout_s=10.0)
    result = simulate_mix(config=tiny, cost=COST, streams=[s], classes=one, duration_s=0.003)
    (f,) = result.streams
    assert f.sent == 3
    assert f.ok == 2
    assert f.rejected == {"queue_full": 1}
    assert result.items == 8  # the refused request's admitted inputs never ran


def test_stream_specs_parse_and_errors_name_the_rule() -> None:
    s = parse_stream("bulk:rate=62.5,inputs=64,timeout=30s,tenant=a,arrivals=poisson,seed=2")
    assert s == Stream(
        work_class="bulk",
        tenant="a",
        rate=62.5,
        inputs=64,
        timeout_s=30.0,
        arrivals="poisson",
        seed=2,
    )
    with pytest.raises(ConfigError, match="needs rate="):
        parse_stream("bulk:inputs=3")
    with pytest.raises(ConfigError, match="each setting must be one of rate="):
        parse_stream("bulk:rate=1,speed=2")
    with pytest.raises(ConfigError, match="stream bulk inputs must be an integer >= 1, got 0"):
        parse_stream("bulk:rate=1,inputs=0")
    with pytest.raises(ConfigError, match="stream nope: class must be one of interactive, bulk"):
        run([Stream(work_class="nope", rate=1.0)])


def test_simulate_mix_cli_prints_one_row_per_stream(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "simulate", "--fixed", "22ms", "--per-item", "0.16ms", "--max-batch-size", "64",
        "--duration", "1s", "--warm-start", "--json",
        "--class", "interactive:share=0.25,timeout=100ms",
        "--class", "bulk:share=0.75,timeout=30s,max_wait=20ms",
        "--mix", "interactive:rate=200", "--mix", "bulk:rate=62.5,inputs=64",
    ]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["class"]) for r in rows] == [
        ("classes", "interactive"),
        ("classes", "bulk"),
    ]
    for key in ("tenant", "offered_per_s", "ok_per_s", "p50_ms", "p99_ms", "rejected"):
        assert key in rows[0]
    assert main(["simulate", "--tenant", "a"]) == 1
    assert "need --class" in capsys.readouterr().err


def test_tune_mix_finds_the_setting_within_each_class_target_or_says_none_does() -> None:
    def tune(targets: dict[str, float]):  # type: ignore[no-untyped-def]
        return tune_mix(
            config=CONFIG,
            cost=COST,
            streams=[QUERIES, BULK],
            classes=CLASSES,
            targets_s=targets,
            duration_s=1.0,
            waits_s=(0.002,),
        )

    got = tune({"interactive": 0.08})
    assert got.best is not None
    # Passes of 64 serve the most; smaller ones cannot keep up with the bulk job.
    assert got.best.max_batch_size == 64
    assert got.best.p99_ms["interactive"] <= 80.0
    assert got.ranked[0] is got.best
    tight = tune({"interactive": 0.005})
    assert tight.best is None
    assert tight.ranked[0].worst > 1.0
    with pytest.raises(ConfigError, match="target class must be one of interactive, bulk"):
        tune({"gold": 0.1})


def test_tune_cli_takes_per_class_targets(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "tune", "--fixed", "22ms", "--per-item", "0.16ms", "--queue-size", "1024",
        "--warm-start", "--duration", "0.4s", "--json",
        "--class", "interactive:share=0.25,timeout=100ms",
        "--class", "bulk:share=0.75,timeout=30s,max_wait=20ms",
        "--mix", "interactive:rate=200", "--mix", "bulk:rate=62.5,inputs=64",
    ]  # fmt: skip
    assert main([*argv, "--target", "interactive=80ms", "--max-batch-limit", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["met"] is True
    assert out["best"]["max_batch_size"] == 64
    assert main([*argv, "--target", "interactive=1ms", "--max-batch-limit", "2"]) == 1
    assert json.loads(capsys.readouterr().out)["best"] is None


def test_tune_mix_applies_the_default_deadline_to_streams_that_state_none() -> None:
    # A class and a stream with no timeout of their own take timeout_s, as simulate --mix
    # does: a deadline shorter than one pass leaves nothing served in time.
    classes = ClassConfig(classes=(WorkClass(name="a"),))

    def tune(timeout_s: float | None):  # type: ignore[no-untyped-def]
        return tune_mix(
            config=CONFIG,
            cost=COST,
            streams=[parse_stream("a:rate=100")],
            classes=classes,
            targets_s={"a": 1.0},
            duration_s=1.0,
            waits_s=(0.002,),
            max_batch_size=8,
            timeout_s=timeout_s,
        )

    assert tune(None).met
    short = tune(0.005)
    assert not short.met
    assert all(e.loss["a"] > 0.9 for e in short.ranked)
