"""deploy/monitoring/: the alerting rules and the Grafana dashboard, against the real tools.

* ``promtool check rules`` accepts the rules, and ``promtool test rules`` runs their unit
  tests (``alerts_test.yml``): each alert fires on its condition and not just below it;
* every metric the rules and the dashboard name is one a real app exports;
* a real Prometheus (Debian's, installed by the test set-up when missing) scrapes a real
  server for a few seconds: it loads the rules with no error, its count of requests is the
  server's, and every query of the dashboard evaluates.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import Any

import httpx
import pytest
import yaml

from batchserve.engines.loader import load_model
from batchserve.server import App, ModelSettings, ServerSettings
from batchserve_testing.process import free_port, wait_until
from batchserve_testing.tools import find_prometheus, find_promtool

HERE = pathlib.Path(__file__).resolve().parent
MONITORING = HERE.parent.parent / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
_METRIC = re.compile(r"\bbatchserve_[a-z_]+\b")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for g in groups for rule in g["rules"]]


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    promtool = find_promtool()
    for args in (["check", "rules", RULES.name], ["test", "rules", "alerts_test.yml"]):
        done = subprocess.run(
            [promtool, *args], cwd=MONITORING, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "SUCCESS: 6 rules found"
        in subprocess.run(
            [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=True
        ).stdout
    )


async def test_every_metric_named_is_one_the_server_exports() -> None:
    async def exposition() -> str:
        model = ModelSettings(name="m", spec="synthetic:fixed=0ms,per_item=0ms")
        async with App(ServerSettings(models=(model,)), loader=load_model) as app:
            await app.wait_ready()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
                assert (await c.post("/v1/embeddings", json={"input": "x"})).status_code == 200
                return (await c.get("/metrics")).text

    text = await exposition()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    named = {m for e in rule_exprs() + dashboard_exprs() for m in _METRIC.findall(e)}
    assert len(named) >= 12
    assert named <= exported, sorted(named - exported)


async def test_label_sets_stay_bounded_whatever_clients_send() -> None:
    """Model names, paths and bodies from clients never become label values."""

    async def exposition(names: list[str]) -> str:
        model = ModelSettings(name="m", spec="synthetic:fixed=0ms,per_item=0ms")
        async with App(ServerSettings(models=(model,)), loader=load_model) as app:
            await app.wait_ready()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
                for name in names:
                    await c.post("/v1/embeddings", json={"model": name, "input": "x"})
                    await c.post(f"/v2/models/{name}/infer", json={"inputs": []})
                    await c.get(f"/v2/models/{name}/stats")
                    await c.post("/v1/embeddings", content=name.encode())
                return (await c.get("/metrics")).text

    def series(text: str) -> set[str]:
        return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line[:1] != "#"}

    few = series(await exposition([f"nope{i}" for i in range(2)]))
    many = series(await exposition([f"other-{i}" for i in range(40)]))
    assert many == few
    assert not any("nope" in s or "other-" in s for s in many)
    assert '=""' not in "".join(many)


def test_the_dashboard_is_one_grafana_imports() -> None:
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert "batchserve_model_ready" in variables["model"]["definition"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("outcome", "refusals", "queue", "p99", "batch size", "cost model"):
        assert topic in titles


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=5)
    body = r.json()
    assert body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then SIGKILL if it lingers; its stderr."""
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    return err or ""


@pytest.mark.slow
def test_a_real_prometheus_scrapes_a_real_server() -> None:
    prometheus = find_prometheus()
    server = subprocess.Popen(
        [sys.executable, "-m", "batchserve", "serve", "--port", "0",
         "--model", "synthetic:fixed=1ms,per_item=0.1ms"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert server.stdout is not None
    ready = re.match(r"batchserve ready on (http://\S+) ", server.stdout.readline())
    if ready is None:
        pytest.fail(f"the server did not start: {_stop(server)}")
    url = ready.group(1)
    with tempfile.TemporaryDirectory(prefix="prometheus-") as tmp:
        with httpx.Client(timeout=5) as client:
            for i in range(20):
                r = client.post(url + "/v1/embeddings", json={"input": f"t{i}"})
                assert r.status_code == 200
        config = {
            "global": {"scrape_interval": "250ms", "evaluation_interval": "250ms"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "batchserve",
                    "static_configs": [{"targets": [url.removeprefix("http://")]}],
                }
            ],
        }
        conf = pathlib.Path(tmp) / "prometheus.yml"
        conf.write_text(yaml.safe_dump(config))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [prometheus, f"--config.file={conf}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:

            def scraped() -> bool:
                try:
                    q = _query(base, "count_over_time(batchserve_requests_received_total[1m])")
                except (httpx.HTTPError, ValueError):  # not up, or not ready (503 text)
                    return False
                return bool(q) and float(q[0]["value"][1]) >= 2  # a rate needs two samples

            assert wait_until(scraped, timeout_s=30, interval_s=0.2), "no scrape"
            received = _query(base, "batchserve_requests_received_total")
            assert [float(s["value"][1]) for s in received] == [20.0]
            assert received[0]["metric"]["job"] == "batchserve"
            ok = _query(base, 'batchserve_requests_total{outcome="ok"}')
            assert [(s["metric"]["model"], float(s["value"][1])) for s in ok] == [
                ("synthetic", 20.0)
            ]
            rules = httpx.get(f"{base}/api/v1/rules").json()["data"]["groups"]
            loaded = [r for g in rules for r in g["rules"]]
            assert len(loaded) == 6
            assert all(r["health"] == "ok" for r in loaded), loaded
            # Every dashboard query evaluates, as Grafana would send it.
            for expr in dashboard_exprs():
                _query(base, expr.replace("$model", ".*").replace("$__rate_interval", "1m"))
            capacity = _query(base, "batchserve_queue_capacity")
            assert float(capacity[0]["value"][1]) == 1024.0
        finally:
            err = _stop(proc)
            _stop(server)
        assert "level=error" not in err, err[-3000:]
