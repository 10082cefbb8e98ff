"""From the senders' raw records to one report: summary, generator health, JSON, CSV, text.

:func:`merge` puts every process's :class:`~batchserve.loadgen.sender.ShareResult` back in
schedule order (:class:`Records`) and :func:`build_report` computes the
:class:`~batchserve.workload.summary.LoadSummary` that ``demo`` and ``simulate`` print (same
keys, same percentile rule), plus what only an HTTP run knows: the rate actually achieved,
rejections by status, client-side timeouts, the generator's lag behind its schedule and its
CPU use.

Counting rules: ``rejected`` is 429 and 503, by ``X-Reason``; ``timed_out`` is 504 plus
requests the client gave up on; ``errors`` is everything else, by status (or ``connect``,
``connection_lost``, ``protocol`` when no response came). Average batch size is items over
distinct ``X-Batch-Id`` values: items per forward pass, as the seed counts it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from batchserve.loadgen.client import PoolStatistics
from batchserve.loadgen.config import LoadConfig
from batchserve.loadgen.protocol import CLIENT_TIMEOUT, Outcome, classify
from batchserve.loadgen.sender import ShareResult
from batchserve.workload.summary import LoadSummary, percentile, summarize

__all__ = [
    "LAG_WARN_MAX_MS",
    "LAG_WARN_P99_MS",
    "LoadReport",
    "Merged",
    "Records",
    "build_report",
    "format_csv",
    "merge",
    "write_csv",
]

#: The generator warns that it fell behind when its send lag's p99 exceeds this.
LAG_WARN_P99_MS = 1.0
#: ... or when its largest send lag exceeds this.
LAG_WARN_MAX_MS = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Records:
    """Every request of a run in schedule order (global index); times in seconds.

    Attributes:
        offset_s: scheduled send time from the start.
        lag_s: write time minus scheduled time (NaN: never written).
        dispatch_lag_s: hand-over to the connection pool minus scheduled time: the part of
            the lag that is the generator's own (the rest is waiting for a connection).
        latency_s: answer time minus scheduled time (NaN: no answer).
        status: HTTP status, 0 when no response came.
        reason: ``X-Reason`` or the client's reason ("" for successes).
        server_s: the server's own account of the request, arrival to answer
            (``Server-Timing: total``; NaN where it sent none).
    """

    offset_s: tuple[float, ...]
    lag_s: tuple[float, ...]
    dispatch_lag_s: tuple[float, ...]
    latency_s: tuple[float, ...]
    status: tuple[int, ...]
    reason: tuple[str, ...]
    server_s: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.offset_s)

    def outcomes(self) -> list[Outcome]:
        """Each request's outcome."""
        return [classify(s, r) for s, r in zip(self.status, self.reason, strict=True)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Merged:
    """The records plus the run-wide counters summed over processes."""

    records: Records
    items: int
    batches: int
    start_at: float
    end_at: float
    cpu_s: float
    processes: int
    pool: PoolStatistics


def merge(results: Sequence[ShareResult], *, extra_cpu_s: float = 0.0) -> Merged:
    """Combine the shares of one run (``extra_cpu_s``: the coordinator's own CPU)."""
    n = sum(len(r.indices) for r in results)
    offset = [math.nan] * n
    lag = [math.nan] * n
    dispatch_lag = [math.nan] * n
    latency = [math.nan] * n
    status = [0] * n
    reason = [""] * n
    server = [math.nan] * n
    ids: set[bytes] = set()
    for r in results:
        for pos, gi in enumerate(r.indices):
            offset[gi] = r.offsets[pos]
            lag[gi] = r.lag_s[pos]
            dispatch_lag[gi] = r.dispatch_lag_s[pos]
            latency[gi] = r.latency_s[pos]
            status[gi] = r.status[pos]
            if r.server_s:
                server[gi] = r.server_s[pos]
        for pos, text in r.reasons.items():
            reason[r.indices[pos]] = text
        ids |= r.batch_ids
    return Merged(
        records=Records(
            offset_s=tuple(offset),
            lag_s=tuple(lag),
            dispatch_lag_s=tuple(dispatch_lag),
            latency_s=tuple(latency),
            status=tuple(status),
            reason=tuple(reason),
            server_s=tuple(server),
        ),
        items=sum(r.items for r in results),
        batches=len(ids),
        start_at=min((r.start_at for r in results), default=0.0),
        end_at=max((r.end_at for r in results), default=0.0),
        cpu_s=sum(r.cpu_s for r in results) + extra_cpu_s,
        processes=len(results),
        pool=PoolStatistics.pooled(r.pool for r in results),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadReport:
    """What one HTTP load run measured. Latencies in ms from the scheduled send time.

    Attributes:
        summary: the figures ``demo`` and ``simulate`` print, with the same keys.
        api, url, arrivals, seed, inputs_per_request, timeout_s: what was sent.
        achieved_per_s: requests written per second (below ``offered_per_s`` when the
            generator fell behind).
        lag_p50_ms, lag_p99_ms, lag_max_ms: how late requests were written.
        dispatch_lag_p99_ms, dispatch_lag_max_ms: how late the generator handed them to
            its connection pool (its own timing and CPU; the rest of the lag is waiting
            for a connection).
        unsent: requests abandoned before they could be written.
        timed_out_server: 504 answers; timed_out_client: requests the client gave up on.
        rejected_by_status: 429/503 answers by status.
        errors_by_kind: errors by status, or by what failed when no response came.
        items, batches: inputs answered and distinct batch ids (``avg_batch`` = ratio).
        connections: the connection pools' counters, summed over processes (peaks too;
            see :class:`~batchserve.loadgen.client.PoolStatistics`). A request that found
            no idle connection waited for a new or a freed one, and the wait is in its lag.
        processes: sender processes; cpu_s: the generator's CPU time during the run;
        cpu_core_percent: that per second of run, in % of one core; cpu_machine_percent:
            the same in % of all cores.
        warnings: sentences about anything that makes the figures doubtful.
        priority, tenant: the class of work and tenant the requests named (None: none).
    """

    summary: LoadSummary
    api: str
    url: str
    arrivals: str
    seed: int
    inputs_per_request: int
    timeout_s: float | None
    achieved_per_s: float
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    dispatch_lag_p99_ms: float
    dispatch_lag_max_ms: float
    unsent: int
    timed_out_server: int
    timed_out_client: int
    rejected_by_status: dict[str, int] = field(default_factory=dict)
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    items: int
    batches: int
    connections: PoolStatistics
    processes: int
    cpu_s: float
    cpu_core_percent: float
    cpu_machine_percent: float
    warnings: tuple[str, ...] = ()
    priority: str | None = None
    tenant: str | None = None

    @property
    def fell_behind(self) -> bool:
        """Whether the generator's own timing missed the schedule past the thresholds."""
        return _over(self.dispatch_lag_p99_ms, self.dispatch_lag_max_ms)

    @property
    def kept_schedule(self) -> bool:
        """Whether every request was written on time (within the thresholds)."""
        return not _over(self.lag_p99_ms, self.lag_max_ms) and self.unsent == 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the demo's keys first in its order, then the rest."""
        out = self.summary.to_dict()
        extras = asdict(self)
        del extras["summary"]
        extras["warnings"] = list(self.warnings)
        out.update(extras)
        return out

    def format_text(self) -> str:
        """The seed's one-line row, then the details, for a terminal."""
        s = self.summary
        rej = ", ".join(f"{k} {v}" for k, v in sorted(s.rejected_by_reason.items())) or "none"
        by_status = ", ".join(f"{k}: {v}" for k, v in sorted(self.rejected_by_status.items()))
        errs = ", ".join(f"{k} {v}" for k, v in sorted(self.errors_by_kind.items())) or "none"
        lines = [
            s.format_row(),
            f"  rate      offered {s.offered_per_s:.1f}/s  achieved {self.achieved_per_s:.1f}/s"
            f"  ok {s.ok_per_s:.1f}/s   ({s.sent} scheduled, {s.ok} ok,"
            f" {s.duration_s:.2f} s)",
            f"  latency   p50 {s.p50_ms:.2f}  p90 {s.p90_ms:.2f}  p99 {s.p99_ms:.2f}"
            f"  max {s.max_ms:.2f} ms (ok requests, from the scheduled send time)",
            f"  batches   {s.avg_batch:.2f} items per batch ({self.items} items,"
            f" {self.batches} batch ids)",
            f"  rejected  {rej}" + (f" ({by_status})" if by_status else ""),
            f"  timed out {self.timed_out_server} by the server (504),"
            f" {self.timed_out_client} by the client",
            f"  errors    {errs}",
            f"  generator lag p50 {self.lag_p50_ms:.3f}  p99 {self.lag_p99_ms:.3f}"
            f"  max {self.lag_max_ms:.3f} ms (its own: p99 {self.dispatch_lag_p99_ms:.3f}"
            f"  max {self.dispatch_lag_max_ms:.3f} ms); CPU {self.cpu_core_percent:.0f}% of one"
            f" core ({self.cpu_machine_percent:.0f}% of {os.cpu_count() or 1}) in"
            f" {self.processes} process{'es' if self.processes > 1 else ''};"
            f" {self.connections.opened} connections opened, peak {self.connections.peak_open}",
        ]
        lines.extend(f"  WARNING: {w}" for w in self.warnings)
        return "\n".join(lines)


def build_report(config: LoadConfig, merged: Merged) -> LoadReport:
    """Summarize a merged run of ``config``."""
    rec = merged.records
    n = len(rec)
    ok_latencies: list[float] = []
    rejected_by_reason: dict[str, int] = {}
    rejected_by_status: dict[str, int] = {}
    errors_by_kind: dict[str, int] = {}
    timed_out_server = timed_out_client = 0
    for status, reason, latency in zip(rec.status, rec.reason, rec.latency_s, strict=True):
        outcome = classify(status, reason)
        if outcome is Outcome.OK:
            ok_latencies.append(latency)
        elif outcome is Outcome.REJECTED:
            key = reason or f"http_{status}"
            rejected_by_reason[key] = rejected_by_reason.get(key, 0) + 1
            rejected_by_status[str(status)] = rejected_by_status.get(str(status), 0) + 1
        elif outcome is Outcome.TIMED_OUT:
            if reason == CLIENT_TIMEOUT and status == 0:
                timed_out_client += 1
            else:
                timed_out_server += 1
        else:
            kind = str(status) if status else (reason.split(":", 1)[0] or "unknown")
            errors_by_kind[kind] = errors_by_kind.get(kind, 0) + 1
    wall_s = max(merged.end_at - merged.start_at, 0.0)
    duration_s = max(wall_s, config.duration_s)
    written = [(off, lag) for off, lag in zip(rec.offset_s, rec.lag_s, strict=True) if lag == lag]
    lags_ms = sorted(lag * 1e3 for _, lag in written)
    last_write = max((off + lag for off, lag in written), default=0.0)
    send_window = max(config.duration_s, last_write)
    summary = summarize(
        name=config.label,
        latencies_s=ok_latencies,
        sent=n,
        duration_s=duration_s,
        offered_per_s=n / config.duration_s if config.duration_s > 0 else 0.0,
        rejected_by_reason=rejected_by_reason,
        timed_out=timed_out_server + timed_out_client,
        errors=sum(errors_by_kind.values()),
        items=merged.items,
        batches=merged.batches,
    )
    cpus = os.cpu_count() or 1
    core_pct = 100.0 * merged.cpu_s / wall_s if wall_s > 0 else 0.0
    lag_p99 = percentile(lags_ms, 0.99)
    lag_max = lags_ms[-1] if lags_ms else 0.0
    own_ms = sorted(v * 1e3 for v in rec.dispatch_lag_s if v == v)
    own_p99 = percentile(own_ms, 0.99)
    own_max = own_ms[-1] if own_ms else 0.0
    unsent = n - len(written)
    warnings = _warnings(
        config, merged, n, lags_ms, unsent, lag=(lag_p99, lag_max), own=(own_p99, own_max)
    )
    return LoadReport(
        priority=config.priority,
        tenant=config.tenant,
        summary=summary,
        api=config.api,
        url=config.url,
        arrivals=config.arrivals,
        seed=config.seed,
        inputs_per_request=config.inputs_per_request,
        timeout_s=config.timeout_s,
        achieved_per_s=_r(len(written) / send_window if send_window > 0 else 0.0),
        lag_p50_ms=_r(percentile(lags_ms, 0.5)),
        lag_p99_ms=_r(lag_p99),
        lag_max_ms=_r(lag_max),
        dispatch_lag_p99_ms=_r(own_p99),
        dispatch_lag_max_ms=_r(own_max),
        unsent=unsent,
        timed_out_server=timed_out_server,
        timed_out_client=timed_out_client,
        rejected_by_status=rejected_by_status,
        errors_by_kind=errors_by_kind,
        items=merged.items,
        batches=merged.batches,
        connections=merged.pool,
        processes=merged.processes,
        cpu_s=_r(merged.cpu_s),
        cpu_core_percent=_r(core_pct),
        cpu_machine_percent=_r(core_pct / cpus),
        warnings=tuple(warnings),
    )


def _over(p99_ms: float, max_ms: float) -> bool:
    return p99_ms > LAG_WARN_P99_MS or max_ms > LAG_WARN_MAX_MS


def _warnings(
    config: LoadConfig,
    merged: Merged,
    n: int,
    lags_ms: list[float],
    unsent: int,
    *,
    lag: tuple[float, float],
    own: tuple[float, float],
) -> list[str]:
    """Sentences about what makes the run's figures doubtful, and who is to blame."""
    out: list[str] = []
    if _over(*own):
        out.append(
            f"the generator fell behind its schedule: it handed requests over up to "
            f"{own[1]:.2f} ms late (p99 {own[0]:.2f} ms), its own timing and CPU. Latencies "
            f"still count from the scheduled time, but the server did not get the load as "
            f"scheduled: lower the rate, add --processes, or give the generator a quieter CPU"
        )
    if _over(*lag) or unsent:
        late = sum(1 for v in lags_ms if v > LAG_WARN_P99_MS)
        slow = (
            f"; {merged.pool.slow_dials} connection attempts took over 100 ms (longest "
            f"{merged.pool.max_dial_s * 1e3:.0f} ms: a full listen backlog on the server makes the "
            f"kernel resend the SYN after 1 s)"
            if merged.pool.slow_dials
            else ""
        )
        out.append(
            f"requests were written late: lag p99 {lag[0]:.2f} ms, max {lag[1]:.2f} ms, "
            f"{late} of {n} more than {LAG_WARN_P99_MS:g} ms late, {unsent} never written; "
            f"{merged.pool.waits} found no idle connection and waited for one "
            f"({merged.pool.dial_waits} behind {config.max_dials} connection attempts in "
            f"progress){slow}. The waits are in the latencies, but the server saw fewer "
            f"requests at once than scheduled"
        )
    if merged.pool.cap_waits:
        out.append(
            f"max_connections ({config.max_connections}) was reached: {merged.pool.cap_waits} "
            f"requests waited for a connection to free up (closed-loop pacing); raise "
            f"--max-connections"
        )
    if merged.pool.failed:
        out.append(f"{merged.pool.failed} connection attempts failed")
    return out


def format_csv(reports: Iterable[LoadReport], *, header: bool = True) -> str:
    """CSV rows with :meth:`LoadReport.to_dict`'s keys as columns.

    Dict-valued cells are compact JSON; the warnings are joined with `` | ``.
    """
    buf = io.StringIO()
    write_csv(buf, reports, header=header)
    return buf.getvalue()


def write_csv(out: TextIO, reports: Iterable[LoadReport], *, header: bool = True) -> None:
    """Write :func:`format_csv`'s rows to ``out``."""
    writer: Any = None
    for report in reports:
        row = report.to_dict()
        if writer is None:
            writer = csv.DictWriter(out, fieldnames=list(row), lineterminator="\n")
            if header:
                writer.writeheader()
        writer.writerow({k: _cell(v) for k, v in row.items()})


def _cell(value: object) -> object:
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    if isinstance(value, list):
        return " | ".join(str(v) for v in value)
    if value is None:
        return ""
    return value


def _r(v: float) -> float:
    return round(v, 3) if math.isfinite(v) else v
