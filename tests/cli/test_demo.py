"""`batchserve demo`: the seed's rows, its keys, and its outcome identity."""

import json
import subprocess
import sys

import pytest

from batchserve.workload.arrivals import arrival_times

KEYS = [
    "name",
    "max_batch_size",
    "max_wait_s",
    "offered_per_s",
    "ok_per_s",
    "avg_batch",
    "p50_ms",
    "p99_ms",
    "rejected",
    "timed_out",
]


def test_constant_schedule_is_exact() -> None:
    assert arrival_times(rate=4, duration_s=1.0) == [0.0, 0.25, 0.5, 0.75]


def test_poisson_schedule_is_seeded() -> None:
    a = arrival_times(rate=100, duration_s=1.0, arrivals="poisson", seed=7)
    assert a == arrival_times(rate=100, duration_s=1.0, arrivals="poisson", seed=7)
    assert a != arrival_times(rate=100, duration_s=1.0, arrivals="poisson", seed=8)
    assert 60 < len(a) < 140
    assert a == sorted(a)


@pytest.mark.slow
def test_demo_json_rows() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "batchserve", "demo", "--json", "--duration", "0.4s"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["name"] for r in rows][:4] == [
        "no batching (batch=1)",
        "batch<=8,  wait 2 ms",
        "batch<=32, wait 2 ms",
        "batch<=32, wait 20 ms",
    ]
    for r in rows:
        assert list(r)[: len(KEYS)] == KEYS
        # Every scheduled request is accounted for exactly once.
        assert r["ok"] + r["rejected"] + r["timed_out"] + r["errors"] == r["sent"] == 240
    batch1, _, batch32 = rows[0], rows[1], rows[2]
    # Generous bounds (a loaded 2-core machine): batching serves nearly everything, and
    # admission refuses at once what a single-item model cannot serve in time.
    assert batch32["ok"] >= 0.95 * batch32["sent"]
    assert batch1["rejected"] > batch1["timed_out"]


def test_demo_rejects_bad_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "batchserve", "demo", "--duration", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "must be a duration with a unit" in out.stderr
