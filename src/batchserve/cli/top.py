"""``batchserve top URL``: the dashboard's view in a terminal, for a server without a browser.

It polls the server's ``/status`` (:mod:`batchserve.server.ops.live`) every ``--interval``
and redraws, per model, what ``/dashboard`` shows: requests by outcome with their rates
(the difference of two readings), the queue against its size, queue wait and forward p50
and p99, the batch size distribution, refusals and other errors by reason, and the cost
model's fit beside the measured passes. Items are named in the model's unit (``/status``'s
``item``): a reranker's queue, batch sizes, throughput and cost are in (query, passage)
pairs, an embedder's and a classifier's in texts. ``--once`` prints one reading and exits
(rates need two readings, so they show as ``-``). It needs ``rich`` (``pip install
'batchserve[top]'``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import httpx

from batchserve.cli._common import HelpFormatter, positive_duration, positive_int

__all__ = ["add_parser", "render"]

_OUTCOMES = ("ok", "late", "rejected", "expired", "cancelled", "failed", "invalid")
_COLORS = {
    "ok": "green",
    "late": "yellow",
    "rejected": "red",
    "expired": "magenta",
    "cancelled": "bright_black",
    "failed": "bright_red",
    "invalid": "bright_black",
}
_BLOCKS = " ▁▂▃▄▅▆▇█"


def add_parser(sub: Any) -> None:
    """Register the ``top`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "top",
        help="watch a running server in the terminal",
        description="The live dashboard in a terminal: polls URL/status and redraws.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--interval", type=positive_duration, default=1.0, help="between readings (1s)")
    p.add_argument("--once", action="store_true", help="print one reading and exit")
    p.add_argument("--width", type=positive_int, default=None, help="columns (the terminal's)")
    p.set_defaults(run=run)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _histogram(sizes: dict[str, int], max_batch: int, width: int = 64) -> str:
    """One character per batch size 1..max (grouped when there are more than ``width``)."""
    per = max(1, -(-max_batch // width))
    cells = [0] * (-(-max_batch // per))
    for size, count in sizes.items():
        cells[min(len(cells) - 1, (int(size) - 1) // per)] += count
    top = max(cells) or 1
    return "".join(_BLOCKS[0 if c == 0 else max(1, round(c / top * 8))] for c in cells)


def _unit(m: dict[str, Any]) -> str:
    """The model's items, plural: ``pairs``, ``texts``, or ``items`` (no known unit)."""
    item = m.get("item")
    return f"{item}s" if item else "items"


def _model(
    name: str, m: dict[str, Any], rates: dict[str, float] | None, items_per_s: float | None
) -> Any:
    from rich.console import Group
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    s = m["settings"]
    unit = _unit(m)
    requests = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("outcome", "total", "per s"):
        requests.add_column(col, justify="left" if col == "outcome" else "right")
    for o in _OUTCOMES:
        rate = "-" if rates is None else f"{rates[o]:.1f}"
        requests.add_row(Text(o, style=_COLORS[o]), str(m["requests"][o]), rate)
    reasons = Table(box=None, pad_edge=False, show_edge=False)
    reasons.add_column("refused / error")
    reasons.add_column("", justify="right")
    for reason, n in {**m["refusals"], **m["errors"]}.items():
        reasons.add_row(reason, str(n))
    latency = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("ms", "p50", "p99", "of"):
        latency.add_column(col, justify="left" if col == "ms" else "right")
    for label, key in (("queue wait", "queue_wait_s"), ("forward", "forward_s")):
        q = m[key]
        latency.add_row(label, _ms(q["p50"]), _ms(q["p99"]), str(q["n"]))
    b, cost, queue = m["batches"], m["cost"], m["queue"]
    fit = (
        "not fitted yet"
        if cost["fixed_s"] is None
        else f"{_ms(cost['fixed_s'])} ms + {_ms(cost['per_item_s'])} ms/{unit[:-1]}"
    )
    measured = sorted(cost["measured"], key=lambda p: -p["passes"])[:6]
    tokens = m.get("tokens")
    by_tokens = (
        Text(
            f"by tokens: padding waste {tokens['waste']:.2f}x, "
            f"{_ms(tokens['fixed_s'])} ms + {tokens['per_token_s'] * 1e6:.0f} us/padded token"
        )
        if tokens
        else Text("")
    )
    right = Group(
        Text(
            f"queue {queue['depth']} / {queue['size']} {unit} waiting, "
            f"{queue['running_items']} running"
        ),
        Text(""),
        latency,
        Text(""),
        Text(
            f"batch sizes in {unit} 1..{s['max_batch_size']}: mean {b['mean_size']:.2f} "
            f"over {b['passes']} passes"
        ),
        Text(_histogram(b["sizes"], s["max_batch_size"]), style="blue"),
        Text(""),
        Text(
            f"{b['items']} {unit} in passes, "
            + ("-" if items_per_s is None else f"{items_per_s:.1f}")
            + f" {unit}/s"
        ),
        Text(""),
        Text(f"cost fit {fit} ({cost['samples']} passes)"),
        Text(
            "measured "
            + (", ".join(f"{p['size']}: {_ms(p['mean_forward_s'])} ms" for p in measured) or "-")
        ),
        by_tokens,
    )
    grid = Table.grid(padding=(0, 4))
    grid.add_column()
    grid.add_column()
    grid.add_row(Group(requests, Text(""), reasons), right)
    settings = (
        f"max batch {s['max_batch_size']} · max wait {_ms(s['max_wait_s'])} ms · queue "
        f"{s['queue_size']} · workers {s['workers']} · timeout {s['timeout_s']:g} s · "
        f"by {s.get('batch_by', 'count')}"
    )
    kind = m.get("kind") or "loading"
    if m.get("item") == "pair":
        kind += " · items are (query, passage) pairs"
    elif m.get("item"):
        kind += f" · items are {unit}"
    return Group(Rule(f"[bold]{name}[/] {kind} · {m['state']}"), Text(settings, style="dim"), grid)


def render(status: dict[str, Any], previous: dict[str, Any] | None, url: str) -> Any:
    """A rich renderable of one ``/status`` reading (rates against ``previous``, if any)."""
    from rich.console import Group
    from rich.text import Text

    dt = status["time_unix"] - previous["time_unix"] if previous is not None else 0.0
    parts: list[Any] = [
        Text(
            f"batchserve {status['version']} · {url} · up {status['uptime_s']:.0f} s · "
            f"received {status['received']} · in flight {status['in_flight']} · "
            f"no model: {status['unknown_model_requests']}"
            + (" · DRAINING" if status["draining"] else ""),
            style="bold",
        )
    ]
    for name, m in status["models"].items():
        rates = items_per_s = None
        if previous is not None and dt > 0 and name in previous["models"]:
            before = previous["models"][name]
            rates = {o: (m["requests"][o] - before["requests"][o]) / dt for o in _OUTCOMES}
            items_per_s = (m["batches"]["items"] - before["batches"]["items"]) / dt
        parts.append(_model(name, m, rates, items_per_s))
    return Group(*parts)


def run(args: argparse.Namespace) -> int:
    """Poll and draw until interrupted (or once)."""
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        raise ImportError("batchserve top needs rich: pip install 'batchserve[top]'") from None
    url = args.url.rstrip("/")
    console = Console(width=args.width)
    with httpx.Client(timeout=5.0) as client:

        def read() -> dict[str, Any]:
            try:
                response = client.get(url + "/status")
                response.raise_for_status()
            except httpx.HTTPError as exc:
                raise ConnectionError(f"cannot read {url}/status: {exc}") from None
            status: dict[str, Any] = response.json()
            return status

        status = read()
        if args.once:
            console.print(render(status, None, url))
            return 0
        previous = None
        with Live(render(status, None, url), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                previous, status = status, read()
                live.update(render(status, previous, url), refresh=True)
