"""`batchserve simulate`: the deterministic seed's figures and verdict, byte for byte, and
the same bytes for the same seed."""

import json
import os
import subprocess
import sys

import pytest

from batchserve.cli import main

SEED_OUTPUT = """\
STEP 1: serve 256 requests UNBATCHED (one per forward pass)
  forward passes : 256
  total time     : 5632 ms
  throughput     : 45.5 req/s

STEP 2: serve the same 256 requests BATCHED (up to 32 per pass)
  forward passes : 8
  total time     : 672 ms
  throughput     : 381.0 req/s

STEP 3: batching shares the fixed per-pass overhead across the batch
  throughput gain: 8.4x

BATCHING RAISED THROUGHPUT (same work, fewer passes): YES
Batching is the first serving lever. Next: quantization to cut the cost per pass.
"""

SEED_ARGS = ["simulate", "--backlog", "256", "--fixed", "20ms", "--per-item", "2ms"]


def test_backlog_reproduces_the_seed_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEED_ARGS, "--max-batch-size", "32"]) == 0
    assert capsys.readouterr().out == SEED_OUTPUT


def test_backlog_exits_1_when_the_gain_is_not_above_2x(capsys: pytest.CaptureFixture[str]) -> None:
    # Passes of 2: 128 passes of 24 ms = 3072 ms, 83.3 req/s, a gain of 1.8x.
    assert main([*SEED_ARGS, "--max-batch-size", "2"]) == 1
    out = capsys.readouterr().out
    assert "  total time     : 3072 ms\n" in out
    assert "  throughput gain: 1.8x\n" in out
    assert out.endswith("BATCHING RAISED THROUGHPUT (same work, fewer passes): NO\n")


def test_backlog_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEED_ARGS, "--max-batch-size", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unbatched"]["passes"] == 256
    assert out["batched"]["passes"] == 8
    assert out["batched"]["total_s"] == pytest.approx(0.672)
    assert out["gain"] == pytest.approx(5632 / 672)
    assert out["ok"] is True


def test_open_loop_defaults_are_the_go_seeds_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["sent"], row["offered_per_s"], row["timeout_s"], row["queue_size"]) == (
        900,
        600.0,
        0.25,
        64,
    )
    assert row["ok"] + row["rejected"] + row["timed_out"] == row["sent"]
    assert row["expired"] + row["late"] == row["timed_out"]
    for key in ("ok_per_s", "avg_batch", "p50_ms", "p99_ms", "rejected_by_reason", "expired"):
        assert key in row


def test_open_loop_text_names_every_outcome(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--rate", "2000", "--max-batch-size", "4", "--timeout", "30ms"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "batch<=4, wait 2ms" in out
    assert "infeasible" in out
    assert "expired" in out


def run_cli(*args: str, hashseed: str) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    return subprocess.run(
        [sys.executable, "-m", "batchserve", *args],
        capture_output=True,
        check=True,
        timeout=120,
        env=env,
    ).stdout


@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_same_seed_same_bytes_across_processes(fmt: list[str]) -> None:
    args = ["simulate", "--arrivals", "poisson", "--seed", "5", "--rate", "900", *fmt]
    first = run_cli(*args, hashseed="1")
    assert first == run_cli(*args, hashseed="2")
    assert first != run_cli(*args[:4], "6", *args[5:], hashseed="1")


def test_simulate_replicas_prints_the_fleet_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--replicas", "3", "--rate", "7500", "--duration", "1s"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "fleet: 3 replicas, routing least_conn" in out
    assert "3 x batch<=32, wait 2ms" in out
    assert main([*args, "--routing", "round_robin", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["replicas"], row["routing"], row["sent"]) == (3, "round_robin", 7500)
    assert len(row["per_replica"]) == 3
    assert sum(r["ok"] for r in row["per_replica"]) == row["ok"]
    assert main([*args, "--routing", "round_robin", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == row


def test_simulate_a_padded_model_by_tokens_and_by_count(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "simulate",
        "--fixed",
        "10ms",
        "--per-item",
        "0ms",
        "--padded",
        "--per-token",
        "0.37ms",
        "--tokens",
        "5:202",
        "--rate",
        "40",
        "--duration",
        "30s",
        "--arrivals",
        "poisson",
        "--timeout",
        "1s",
        "--queue-size",
        "1024",
    ]
    rows = {}
    for by in ("tokens", "count"):
        assert main([*args, "--batch-by", by, "--json"]) == 0
        rows[by] = json.loads(capsys.readouterr().out)
    assert rows["tokens"]["ok_per_s"] > 1.3 * rows["count"]["ok_per_s"]
    assert 1.0 <= rows["tokens"]["padding_waste"] < 1.2
    assert "padding_waste" not in rows["count"]
    assert rows["tokens"]["tokens"] == [5, 202]
    assert main([*args]) == 0
    out = capsys.readouterr().out
    assert "padding waste" in out
    assert "per padded token, padded whole" in out


def test_simulate_sorted_subpasses_from_a_profiled_cost(capsys: pytest.CaptureFixture[str]) -> None:
    # A CPU-shaped sub-pass cost (5 ms a sub-pass, 250 us a token, 0.5 us a token x its
    # length): a pass of mixed lengths costs its sorted sub-passes, so it is served at
    # nearly the cost of its real tokens (about 33 ms a text of 5 to 202 tokens: 30/s), and
    # faster than the same model padded whole even without attention.
    args = [
        "simulate",
        "--fixed",
        "1ms",
        "--per-item",
        "0ms",
        "--per-token",
        "250us",
        "--tokens",
        "5:202",
        "--rate",
        "60",
        "--duration",
        "20s",
        "--arrivals",
        "poisson",
        "--timeout",
        "1s",
        "--batch-by",
        "count",
        "--json",
    ]
    assert main([*args, "--subpass-fixed", "5ms", "--attention", "0.5us"]) == 0
    sorted_ = json.loads(capsys.readouterr().out)
    assert main([*args, "--padded"]) == 0
    padded = json.loads(capsys.readouterr().out)
    assert sorted_["pass_shape"] == "sorted"
    assert (sorted_["subpass_fixed_s"], sorted_["attention_s"]) == (0.005, 0.5e-6)
    real_s = sum(n * 250e-6 + n * n * 0.5e-6 for n in range(5, 203)) / 198
    assert sorted_["ok_per_s"] > 0.85 / real_s
    assert sorted_["ok_per_s"] > 1.15 * padded["ok_per_s"]
    assert main([*args[:-1], "--subpass-fixed", "5ms"]) == 0
    assert "length-sorted sub-passes of 5ms + 250us per padded token" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--per-token", "1ms"], "--per-token needs --tokens"),
        (["--subpass-fixed", "1ms"], "--subpass-fixed needs --tokens"),
        (["--tokens", "5:10", "--padded", "--attention", "1us"], "--attention is a sub-pass's"),
        (["--tokens", "5:10", "--replicas", "2"], "--tokens needs one server"),
        (["--max-batch-tokens", "64"], "--max-batch-tokens needs --tokens"),
        (["--batch-by", "tokens"], "--batch-by tokens needs --tokens"),
        (["--tokens", "5:10", "--mix", "a:rate=5"], "--tokens needs one server"),
    ],
)
def test_simulate_token_flags_say_what_they_need(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *extra]) == 1
    assert message in capsys.readouterr().err
