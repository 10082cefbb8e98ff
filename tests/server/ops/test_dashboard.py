"""The live view: ``/status``, ``/dashboard`` in a real headless browser, ``batchserve top``.

One real server takes a known load (successes, invalid bodies, and a burst past its queue
that is refused ``queue_full``); the server's ``/status`` must count exactly that load. The
dashboard, opened in Debian's Chromium (installed by the test set-up when missing), must
load with no console error and no request leaving the server, and show the same numbers as
``/status``; a screenshot is saved under ``artifacts/`` (git-ignored). ``batchserve top
--once`` renders the same figures in the terminal. A second server, of a reranker folder
built at test time, must have every view count its items as (query, passage) pairs.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import pathlib
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import ROOT, ServerProcess, server_process

from browser import open_browser

pytestmark = pytest.mark.slow

MODEL = "synthetic"
ARTIFACTS = pathlib.Path(os.environ.get("BATCHSERVE_ARTIFACTS", ROOT / "artifacts"))
OK_SEQUENTIAL = 6
INVALID = 2
BURST = 16


@pytest.fixture(scope="module")
def loaded() -> Iterator[tuple[ServerProcess, dict[int, int]]]:
    """A server after a known load, and what its clients saw (status code -> count)."""
    args = ["--model", "synthetic:fixed=40ms,per_item=1ms,dim=4", "--max-batch-size", "2",
            "--queue-size", "2", "--max-wait", "1ms"]  # fmt: skip
    with server_process(args) as server:
        seen: dict[int, int] = {}
        url = server.url + "/v1/embeddings"
        with httpx.Client(timeout=10) as client:
            for i in range(OK_SEQUENTIAL):
                r = client.post(url, json={"model": MODEL, "input": f"text {i}"})
                seen[r.status_code] = seen.get(r.status_code, 0) + 1
            # Bodies that do not parse: one names its model in the path, one does not.
            for target in (url, f"{server.url}/v2/models/{MODEL}/infer"):
                r = client.post(
                    target, content=b"{not json", headers={"content-type": "application/json"}
                )
                seen[r.status_code] = seen.get(r.status_code, 0) + 1

        # Each sender connects first, then all send at once: on a busy machine, threads
        # that connect as they start would spread the burst over more than a pass.
        start = threading.Barrier(BURST)

        def one(i: int) -> int:
            with httpx.Client(timeout=10) as client:
                client.get(server.url + "/v2/health/live")
                start.wait(timeout=30)
                body = {"model": MODEL, "input": f"burst {i}"}
                return client.post(url, json=body).status_code

        # A pass holds 2, the queue 2 more: most of a burst of 16 is refused at once.
        with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
            for code in pool.map(one, range(BURST)):
                seen[code] = seen.get(code, 0) + 1
        yield server, seen
        server.stop()


def test_status_counts_the_known_load(loaded: tuple[ServerProcess, dict[int, int]]) -> None:
    server, seen = loaded
    status = httpx.get(server.url + "/status").json()
    m = status["models"][MODEL]
    assert seen.get(429, 0) > 0, seen  # the burst really overflowed the queue
    assert m["requests"]["ok"] == seen[200]
    assert status["requests"]["invalid"] == seen[400] == INVALID
    assert m["requests"]["invalid"] == status["unknown_model_requests"] == 1
    assert m["refusals"]["queue_full"] == m["requests"]["rejected"] == seen[429]
    assert sum(m["requests"].values()) == OK_SEQUENTIAL + INVALID - 1 + BURST
    assert sum(status["requests"].values()) == status["received"] == OK_SEQUENTIAL + INVALID + BURST
    assert m["queue"] == {"depth": 0, "size": 2, "running_items": 0}
    sizes = {int(k): v for k, v in m["batches"]["sizes"].items()}
    assert sum(n * c for n, c in sizes.items()) == m["batches"]["items"] == seen[200]
    assert max(sizes) <= 2
    assert m["forward_s"]["n"] == m["batches"]["passes"]
    assert 0.040 <= m["forward_s"]["p50"] <= m["forward_s"]["p99"]
    assert m["cost"]["samples"] >= m["batches"]["passes"]
    # The model's 40 ms a pass, as fitted at one item (oversleeping only adds to it; the
    # split between fixed and per-item cost of passes of one and two items is noise).
    assert m["cost"]["fixed_s"] + m["cost"]["per_item_s"] >= 0.035


def _resolve(status: dict[str, Any], field: str) -> Any:
    value: Any = status
    parts = field.split(".")
    if parts[0] == "models":  # a model's name may hold dots
        parts = ["models", MODEL, *field[len("models." + MODEL + ".") :].split(".")]
    for part in parts:
        value = value[part]
    return value


def test_dashboard_in_a_real_browser(loaded: tuple[ServerProcess, dict[int, int]]) -> None:
    server, _ = loaded
    with open_browser() as page:
        page.goto(server.url + "/dashboard")
        page.wait_for("document.body.dataset.updated")
        first = page.evaluate("document.body.dataset.updated")
        page.wait_for(f"document.body.dataset.updated !== '{first}'")  # a second poll: rates
        shown = page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('[data-field]')].map("
            "e => [e.dataset.field, [e.textContent, e.dataset.value]]))"
        )
        bars = page.evaluate(
            "[...document.querySelectorAll('rect[data-size]')].map("
            "r => [Number(r.dataset.size), Number(r.dataset.passes)])"
        )
        status = httpx.get(server.url + "/status").json()
        shot = page.screenshot(ARTIFACTS / "dashboard.png")
        errors, requested = page.errors, page.requested
    assert errors == []
    assert requested
    assert all(u.startswith(server.url + "/") for u in requested), requested
    for field in (
        "models.synthetic.requests.ok",
        "models.synthetic.requests.invalid",
        "models.synthetic.refusals.queue_full",
        "models.synthetic.batches.passes",
        "models.synthetic.batches.items",
        "models.synthetic.item",
        "models.synthetic.queue.depth",
        "models.synthetic.queue_wait_s.p99",
        "models.synthetic.forward_s.p50",
        "models.synthetic.cost.fixed_s",
        "received",
    ):
        assert field in shown, sorted(shown)
    for field, (text, value) in shown.items():
        if field in ("uptime_s", "models.synthetic.state", "models.synthetic.kind"):
            continue
        if field == "models.synthetic.item":
            assert (text, value) == ("· items are texts", "text")  # an embedder's unit
            continue
        want = _resolve(status, field)
        assert float(value) == pytest.approx(want, rel=1e-9), field
        if isinstance(want, int):
            assert text == str(want), field
        elif field.endswith(("_s.p50", "_s.p99")):
            assert text == f"{want * 1e3:.2f}", field
    assert shown["models.synthetic.state"][0] == "ready"
    assert shown["models.synthetic.kind"][0] == status["models"][MODEL]["kind"]
    sizes = status["models"][MODEL]["batches"]["sizes"]
    assert sorted(map(tuple, bars)) == sorted((int(k), v) for k, v in sizes.items())
    assert shot.stat().st_size > 10_000


def top_once(url: str, *, width: int) -> str:
    """What ``batchserve top URL --once`` prints (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-m", "batchserve", "top", url, "--once", "--width", str(width)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_top_renders_the_same_figures_once(loaded: tuple[ServerProcess, dict[int, int]]) -> None:
    server, seen = loaded
    out = top_once(server.url, width=120)
    status = httpx.get(server.url + "/status").json()
    m = status["models"][MODEL]
    assert MODEL in out
    ok = re.search(r"^\s*ok\s+(\d+)\s+-", out, re.MULTILINE)
    assert ok is not None, out
    assert ok.group(1) == str(m["requests"]["ok"]) == str(seen[200])
    full = re.search(r"^\s*queue_full\s+(\d+)", out, re.MULTILINE)
    assert full is not None, out
    assert full.group(1) == str(m["refusals"]["queue_full"])
    assert f"{m['forward_s']['p50'] * 1e3:.2f}" in out
    assert f"{m['queue_wait_s']['p99'] * 1e3:.2f}" in out
    # An embedder's items are texts.
    assert m["item"] == "text"
    assert "embedding · items are texts · ready" in out
    assert f"{m['batches']['items']} texts in passes, - texts/s" in out
    assert "batch sizes in texts 1..2" in out


def test_top_shows_the_padding_of_passes_by_tokens(
    loaded: tuple[ServerProcess, dict[int, int]],
) -> None:
    from rich.console import Console

    from batchserve.cli.top import render

    server, _ = loaded
    status = httpx.get(server.url + "/status").json()
    m = status["models"][MODEL]
    assert m["tokens"] is None  # the synthetic model counts no tokens: by count
    m["settings"]["batch_by"] = "tokens"
    m["tokens"] = {
        "padded": 1100,
        "real": 1000,
        "queued": 0,
        "waste": 1.1,
        "fixed_s": 0.0174,
        "per_token_s": 0.00031,
    }
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(render(status, None, server.url))
    out = console.export_text()
    assert "by tokens: padding waste 1.10x, 17.40 ms + 310 us/padded token" in out
    assert "by tokens" in out.split(MODEL, 1)[1]


@pytest.mark.slow
def test_the_docs_page_reads_at_1280_px_without_scrolling_sideways() -> None:
    with server_process(["--model", "synthetic"]) as server, open_browser() as page:
        page.goto(server.url + "/docs")
        page.wait_for("document.readyState === 'complete'")
        widths = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        backticks = page.evaluate("document.body.innerText.includes('`')")
        page.screenshot(ARTIFACTS / "docs.png")
    assert widths[0] <= widths[1], widths
    assert backticks is False


PASSAGES = (["a cat sleeps", "Paris is in France", "cats hunt at dawn"], ["a dog", "a mat"])


@pytest.fixture(scope="module")
def reranked(reranker_folder: Path) -> Iterator[ServerProcess]:
    """A reranker's server after two reranks: 3 and 2 passages, five pairs."""
    spec = f"{reranker_folder}:backend=torch,threads=1"
    with server_process(["--model", spec, "--max-wait", "1ms"]) as server:
        for passages in PASSAGES:
            r = httpx.post(server.url + "/rerank", json={"query": "q", "texts": passages})
            assert r.status_code == 200, r.text
        yield server
        server.stop()


def test_a_reranker_s_views_count_pairs(reranked: ServerProcess) -> None:
    from rich.console import Console

    from batchserve.cli.top import render

    status = httpx.get(reranked.url + "/status").json()
    ((name, m),) = status["models"].items()
    assert (m["kind"], m["item"]) == ("reranker", "pair")
    assert m["requests"]["ok"] == 2
    assert m["batches"]["items"] == sum(map(len, PASSAGES)) == 5
    out = top_once(reranked.url, width=160)
    assert "reranker · items are (query, passage) pairs · ready" in out
    assert "5 pairs in passes, - pairs/s" in out
    assert f"batch sizes in pairs 1..{m['settings']['max_batch_size']}" in out
    assert " pairs waiting" in out
    assert "ms/pair" in out
    # Two readings make a rate: five pairs in the two seconds between them.
    before = {**status, "time_unix": status["time_unix"] - 2.0}
    before["models"] = {name: {**m, "batches": {**m["batches"], "items": 0}}}
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(render(status, before, reranked.url))
    assert "5 pairs in passes, 2.5 pairs/s" in console.export_text()


def test_a_reranker_s_dashboard_counts_pairs(reranked: ServerProcess) -> None:
    with open_browser() as page:
        page.goto(reranked.url + "/dashboard")
        page.wait_for("document.body.dataset.updated")
        first = page.evaluate("document.body.dataset.updated")
        page.wait_for(f"document.body.dataset.updated !== '{first}'")  # a second poll: rates
        card = page.evaluate("document.querySelector('[data-model]').innerText")
        item = page.evaluate(
            "[...document.querySelectorAll('[data-field$=\\'.item\\']')].map("
            "e => [e.textContent, e.dataset.value])"
        )
        items = page.evaluate(
            "document.querySelector('[data-field$=\\'.batches.items\\']').dataset.value"
        )
        rate = page.evaluate("document.querySelector('[data-rate=items]').textContent")
        titles = page.evaluate(
            "[...document.querySelectorAll('rect[data-size] title')].map(t => t.textContent)"
        )
        page.screenshot(ARTIFACTS / "dashboard-reranker.png")
        errors = page.errors
    assert errors == []
    assert item == [["· items are (query, passage) pairs", "pair"]]
    assert items == "5"
    assert rate == "0.0"  # no pairs between the two polls
    assert "BATCH SIZES IN PAIRS" in card.upper()
    assert "5 pairs in passes" in card
    assert "pairs/s" in card
    assert titles
    assert all(re.fullmatch(r"\d+ pairs: \d+ passes", t) for t in titles), titles
