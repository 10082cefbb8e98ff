"""From raw records to the report: counting rules, batch sizes, lag warnings, JSON and CSV."""

import csv
import io
import json
import math

from batchserve.loadgen.client import PoolStatistics
from batchserve.loadgen.config import LoadConfig
from batchserve.loadgen.progress import ProgressDisplay
from batchserve.loadgen.report import Merged, build_report, format_csv, merge
from batchserve.loadgen.sender import Progress, ShareResult
from batchserve.workload.summary import DEMO_KEYS

NAN = math.nan


def _share(
    indices: list[int],
    rows: list[tuple[float, float, int, str]],
    dispatch: list[float] | None = None,
    **kw: object,
) -> ShareResult:
    """rows: (lag_s, latency_s, status, reason) per request; dispatch lags default to lags."""
    return ShareResult(
        indices=indices,
        offsets=[i * 0.1 for i in indices],
        lag_s=[r[0] for r in rows],
        dispatch_lag_s=dispatch if dispatch is not None else [r[0] for r in rows],
        latency_s=[r[1] for r in rows],
        status=[r[2] for r in rows],
        reasons={p: r[3] for p, r in enumerate(rows) if r[3]},
        start_at=100.0,
        end_at=101.0,
        **kw,  # type: ignore[arg-type]
    )


CFG = LoadConfig(url="http://h", rate=10, duration_s=1, timeout_s=0.25)


def _report_of_mixed_run() -> Merged:
    a = _share(
        [0, 2, 4, 6, 8],
        [
            (0.0001, 0.010, 200, ""),
            (0.0002, 0.020, 200, ""),
            (0.0001, 0.001, 429, "queue_full"),
            (0.0001, 0.002, 503, "draining"),
            (0.0001, 0.250, 504, "deadline_exceeded"),
        ],
        items=2,
        batch_ids={b"1", b"2"},
        cpu_s=0.2,
    )
    b = _share(
        [1, 3, 5, 7, 9],
        [
            (0.0001, 0.030, 200, ""),
            (0.0001, 0.040, 200, ""),
            (0.0001, 0.001, 429, "infeasible"),
            (NAN, 1.25, 0, "client_timeout"),
            (0.0001, 0.005, 500, "model_error"),
        ],
        items=2,
        batch_ids={b"2", b"3"},
        cpu_s=0.3,
    )
    return merge([a, b], extra_cpu_s=0.1)


def test_outcomes_are_counted_by_status_and_reason() -> None:
    merged = _report_of_mixed_run()
    r = build_report(CFG, merged)
    s = r.summary
    assert (s.sent, s.ok, s.rejected, s.timed_out, s.errors) == (10, 4, 3, 2, 1)
    assert s.rejected_by_reason == {"queue_full": 1, "draining": 1, "infeasible": 1}
    assert r.rejected_by_status == {"429": 2, "503": 1}
    assert (r.timed_out_server, r.timed_out_client) == (1, 1)
    assert r.errors_by_kind == {"500": 1}
    assert r.unsent == 1
    # Items over distinct batch ids, across processes: 4 items in batches {1, 2, 3}.
    assert (r.items, r.batches, s.avg_batch) == (4, 3, round(4 / 3, 3))
    assert (s.p50_ms, s.max_ms) == (20.0, 40.0)
    assert r.processes == 2
    assert r.cpu_s == 0.6
    assert r.cpu_core_percent == 60.0
    # Records come back in schedule order.
    assert merged.records.status[:4] == (200, 200, 200, 200)
    assert merged.records.reason[7] == "client_timeout"


def test_a_request_never_written_is_reported() -> None:
    r = build_report(CFG, _report_of_mixed_run())
    assert not r.kept_schedule
    assert not r.fell_behind  # the generator itself was on time
    assert "1 never written" in r.warnings[0]


def test_on_time_sends_raise_no_warning() -> None:
    on_time = _share([0, 1], [(0.0002, 0.01, 200, ""), (0.0009, 0.01, 200, "")])
    r = build_report(CFG, merge([on_time]))
    assert r.warnings == ()
    assert r.kept_schedule
    assert not r.fell_behind


def test_lateness_is_blamed_on_the_generator_or_on_waiting_for_connections() -> None:
    rows = [(0.0002, 0.01, 200, ""), (0.012, 0.02, 200, "")]
    own = build_report(CFG, merge([_share([0, 1], rows)]))
    assert own.fell_behind
    assert not own.kept_schedule
    assert own.warnings[0].startswith("the generator fell behind its schedule: it handed")
    assert "up to 12.00 ms late (p99 0.20 ms)" in own.warnings[0]

    waited = _share(
        [0, 1], rows, dispatch=[0.0002, 0.0001],
        pool=PoolStatistics(waits=1, slow_dials=1, max_dial_s=1.01),
    )  # fmt: skip
    r = build_report(CFG, merge([waited]))
    assert not r.fell_behind
    assert not r.kept_schedule
    (warning,) = r.warnings
    assert warning.startswith("requests were written late: lag p99 0.20 ms, max 12.00 ms")
    assert "1 connection attempts took over 100 ms (longest 1010 ms" in warning
    assert (r.dispatch_lag_max_ms, r.lag_max_ms, r.connections.max_dial_s) == (0.2, 12.0, 1.01)


def test_the_connection_cap_is_reported_when_hit() -> None:
    capped = _share([0], [(0.0001, 0.01, 200, "")], pool=PoolStatistics(cap_waits=5))
    (warning,) = build_report(CFG, merge([capped])).warnings
    assert warning.startswith("max_connections (10000) was reached: 5 requests waited")


def test_json_keys_start_with_the_demos_in_its_order() -> None:
    d = build_report(CFG, _report_of_mixed_run()).to_dict()
    assert list(d)[: len(DEMO_KEYS)] == list(DEMO_KEYS)
    for key in ("p90_ms", "max_ms", "achieved_per_s", "lag_p99_ms", "cpu_core_percent"):
        assert key in d
    assert json.loads(json.dumps(d)) == d


def test_csv_has_one_column_per_json_key_and_json_cells() -> None:
    r = build_report(CFG, _report_of_mixed_run())
    rows = list(csv.DictReader(io.StringIO(format_csv([r, r]))))
    assert len(rows) == 2
    assert list(rows[0]) == list(r.to_dict())
    assert json.loads(rows[0]["rejected_by_reason"]) == r.summary.rejected_by_reason
    assert rows[0]["p50_ms"] == "20.0"


def test_text_report_has_the_seed_row_first() -> None:
    text = build_report(CFG, _report_of_mixed_run()).format_text()
    first = text.splitlines()[0]
    assert first.startswith("openai 10/s")
    assert "ok/s" in first
    assert "rejected    3" in first
    assert "timed out    2" in first
    assert "queue_full 1" in text
    assert "WARNING" in text


def test_progress_is_one_rewritten_line_on_a_terminal_and_plain_lines_otherwise() -> None:
    out = io.StringIO()
    display = ProgressDisplay(out, total=10, duration_s=1, label="x", tty=True)
    display(Progress(elapsed_s=0.1, sent=1, ok=1))
    display(Progress(elapsed_s=0.2, sent=2, ok=2))
    display.close()
    assert "\n" not in out.getvalue()
    assert out.getvalue().count("\r") == 4
    out = io.StringIO()
    display = ProgressDisplay(out, total=10, duration_s=3, label="x", tty=False)
    for t in (0.25, 0.5, 1.0, 1.25, 2.5):
        display(Progress(elapsed_s=t, sent=int(t * 4)))
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1.0/3", "2.5/3"]


def test_the_processes_pools_add_up_and_keep_the_longest_dial() -> None:
    a = PoolStatistics(opened=3, failed=1, peak_open=2, waits=4, slow_dials=1, max_dial_s=0.2)
    b = PoolStatistics(opened=5, peak_open=5, cap_waits=2, retries=1, max_dial_s=1.1)
    merged = merge(
        [
            _share([0], [(0.0001, 0.01, 200, "")], pool=a),
            _share([1], [(0.0001, 0.01, 200, "")], pool=b),
        ]
    )
    assert merged.pool == PoolStatistics(
        opened=8, failed=1, peak_open=7, waits=4, cap_waits=2, slow_dials=1, retries=1,
        max_dial_s=1.1,
    )  # fmt: skip
    assert build_report(CFG, merged).to_dict()["connections"]["opened"] == 8
