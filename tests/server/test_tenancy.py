"""Classes of work and tenants over HTTP, in-process: headers, KServe priority, 4xx, metrics."""

from __future__ import annotations

import argparse
import asyncio
import pathlib

import httpx
import pytest
from batchserve_testmodels import Gate, Recorder
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import client_for, embedding_model

from batchserve.cli import build_parser
from batchserve.cli.serve import build_settings
from batchserve.config import BatchConfig
from batchserve.errors import ConfigError
from batchserve.models.loader import LoadedModel
from batchserve.policy import ClassConfig, Tenant, WorkClass
from batchserve.server import App, ModelSettings, ServerSettings

CLASSES = ClassConfig(
    classes=(
        WorkClass(name="interactive", queue_share=0.5, timeout_s=0.5),
        WorkClass(name="bulk", queue_share=0.5, timeout_s=30.0),
    ),
    tenants=(Tenant(name="alice", weight=2.0),),
)


def sample(exposition: str, name: str, **labels: str) -> float:
    """The sample ``name`` whose labels include ``labels`` (0: none)."""
    return sum(
        s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


def app_with(
    model: LoadedModel,
    *,
    classes: ClassConfig | None = CLASSES,
    tenant_keys: tuple[tuple[str, str], ...] = (),
    queue_size: int = 8,
) -> App:
    batch = BatchConfig(max_batch_size=2, max_wait_s=0.001, queue_size=queue_size)
    settings = ServerSettings(
        models=(ModelSettings(name="m", spec="m", batch=batch, classes=classes),),
        tenant_keys=tenant_keys,
    )
    return App(settings, loader=lambda spec: model)


async def test_unknown_classes_and_bad_values_are_422_naming_the_field() -> None:
    async with client_for(app_with(embedding_model(Recorder()))) as c:
        r = await c.post("/v1/embeddings", json={"input": "a"}, headers={"X-Priority": "gold"})
        assert r.status_code == 422
        error = r.json()["error"]
        assert error["param"] == "X-Priority"
        assert "one of interactive, bulk or a level 0-2, got 'gold'" in error["message"]
        r = await c.post("/v1/embeddings", json={"input": "a"}, headers={"X-Priority": "3"})
        assert r.status_code == 422
        assert "level must be 0 (default) to 2" in r.json()["error"]["message"]
        r = await c.post("/v1/embeddings", json={"input": "a"}, headers={"X-Tenant": "a,b"})
        assert r.status_code == 422
        assert r.json()["error"]["param"] == "X-Tenant"
        body = {
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
            "parameters": {"priority": 7},
        }
        r = await c.post("/v2/models/m/infer", json=body)
        assert r.status_code == 422
        assert r.json()["error"].startswith("parameters.priority: priority level must be")
        body["parameters"] = {"priority": [1]}
        r = await c.post("/v2/models/m/infer", json=body)
        assert r.status_code == 422
        body["parameters"] = {"priority": 1}
        r = await c.post("/v2/models/m/infer", json=body)
        assert r.status_code == 200
        r = await c.post("/v1/embeddings", json={"input": "a"}, headers={"X-Priority": "1"})
        assert r.status_code == 200
        metrics = (await c.get("/metrics")).text
        ok = {"class": "interactive", "outcome": "ok", "tenant": ""}
        assert sample(metrics, "batchserve_class_items_total", **ok) == 2


async def test_a_full_bulk_class_refuses_bulk_but_not_queries() -> None:
    gate = Gate()
    async with client_for(app_with(embedding_model(gate))) as c:

        async def post(priority: str, text: str, tenant: str = "bob") -> httpx.Response:
            headers = {"X-Priority": priority, "X-Tenant": tenant}
            return await c.post("/v1/embeddings", json={"input": text}, headers=headers)

        # Two run (held at the gate), four wait: the bulk class's share of 8.
        bulk = [asyncio.create_task(post("bulk", f"b{i}", "alice")) for i in range(6)]
        await asyncio.to_thread(gate.entered.wait, 5)
        await _until_depth(c, "bulk", 4)
        refused = await post("bulk", "b-more")
        assert refused.status_code == 429
        assert "class bulk is full" in refused.json()["error"]["message"]
        assert float(refused.headers["Retry-After"]) > 0
        query = asyncio.create_task(post("interactive", "q"))
        await _until_depth(c, "interactive", 1)
        gate.release()
        assert (await query).status_code == 200
        assert [r.status_code for r in await asyncio.gather(*bulk)] == [200] * 6
        # The query rode the second pass, ahead of four queued bulk items.
        assert gate.batches[1][0] == "q"
        metrics = (await c.get("/metrics")).text
        ok = {"class": "bulk", "outcome": "ok", "tenant": "alice"}
        assert sample(metrics, "batchserve_class_items_total", **ok) == 6
        # "bob" is not a configured tenant: counted under tenant="" (bounded labels).
        full = {"class": "bulk", "outcome": "rejected_queue_full", "tenant": ""}
        assert sample(metrics, "batchserve_class_items_total", **full) == 1


async def _until_depth(c: httpx.AsyncClient, work_class: str, n: int) -> None:
    """Wait until ``n`` items of ``work_class`` are queued (fails after 10 s)."""
    for _ in range(1000):
        if (await _depths(c))[work_class] == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{work_class} never reached a depth of {n}: {await _depths(c)}")


async def _depths(c: httpx.AsyncClient) -> dict[str, float]:
    text = (await c.get("/metrics")).text
    out = {}
    for work_class in ("interactive", "bulk"):
        out[work_class] = sample(text, "batchserve_class_queue_depth", **{"class": work_class})
    return out


async def test_tenant_keys_name_the_tenant_and_other_keys_are_refused() -> None:
    keys = (("alice", "alice-secret"),)
    async with client_for(app_with(embedding_model(Recorder()), tenant_keys=keys)) as c:
        r = await c.post("/v1/embeddings", json={"input": "a"})
        assert r.status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        r = await c.post("/v1/embeddings", json={"input": "a"}, headers=wrong)
        assert r.status_code == 401
        # The key names the tenant; X-Tenant cannot claim another one.
        good = {"Authorization": "Bearer alice-secret", "X-Tenant": "mallory"}
        r = await c.post("/v1/embeddings", json={"input": "a"}, headers=good)
        assert r.status_code == 200
        metrics = (await c.get("/metrics")).text
        ok = {"class": "bulk", "outcome": "ok", "tenant": "alice"}
        assert sample(metrics, "batchserve_class_items_total", **ok) == 1


async def test_a_model_without_classes_ignores_priority() -> None:
    async with client_for(app_with(embedding_model(Recorder()), classes=None)) as c:
        headers = {"X-Priority": "whatever", "X-Tenant": "x"}
        r = await c.post("/v1/embeddings", json={"input": "a"}, headers=headers)
        assert r.status_code == 200
        assert "batchserve_class_items_total" not in (await c.get("/metrics")).text


def settings(argv: list[str]) -> ServerSettings:
    args: argparse.Namespace = build_parser().parse_args(["serve", *argv])
    return build_settings(args, environ={})


def test_serve_flags_and_the_config_file_configure_classes(tmp_path: pathlib.Path) -> None:
    s = settings(
        [
            *("--model", "a=synthetic", "--model", "b=synthetic"),
            *("--class", "interactive:weight=4,share=0.25,timeout=100ms"),
            *("--class", "bulk:share=0.75,max_wait=20ms", "--class", "b=only"),
            *("--default-class", "a=interactive", "--tenant", "alice:weight=2"),
            *("--tenant-share", "0.5"),
        ]
    )
    a, b = s.models
    assert a.classes is not None
    assert a.classes.names == ("interactive", "bulk")
    assert a.classes.classes[0] == WorkClass(
        name="interactive", weight=4, queue_share=0.25, timeout_s=0.1
    )
    assert a.classes.default_class.name == "interactive"
    assert a.classes.tenants == (Tenant(name="alice", weight=2.0),)
    assert a.classes.tenant_share == 0.5
    assert b.classes is not None
    assert b.classes.names == ("only",)
    config = tmp_path / "c.toml"
    config.write_text(
        'tenant_share = 0.5\n[[tenants]]\nname = "search"\nweight = 2\nkey = "k1"\n'
        '[models.m]\nspec = "synthetic"\ndefault_class = "bulk"\nclasses = [\n'
        '  {name = "interactive", share = 0.25, timeout = "100ms"},\n'
        '  "bulk:share=0.75,timeout=30s",\n]\n'
    )
    s = settings(["--config", str(config)])
    (m,) = s.models
    assert m.classes is not None
    assert m.classes.names == ("interactive", "bulk")
    assert m.classes.default_class.name == "bulk"
    assert m.classes.tenants == (Tenant(name="search", weight=2),)
    assert s.tenant_keys == (("search", "k1"),)
    with pytest.raises(ConfigError, match="class bulk queue_share must be in"):
        settings(["--model", "synthetic", "--class", "bulk:share=3"])
    with pytest.raises(ConfigError, match="need classes"):
        settings(["--model", "synthetic", "--tenant", "alice"])
    config.write_text('[models.m]\nspec = "synthetic"\nclasses = [{name = "x", speed = 1}]\n')
    with pytest.raises(ConfigError, match=r"classes\[0\]: unknown key 'speed'"):
        settings(["--config", str(config)])


async def test_tenant_keys_guard_the_model_listings_and_the_spec_as_they_guard_inference() -> None:
    keys = (("alice", "alice-secret"),)
    async with client_for(app_with(embedding_model(Recorder()), tenant_keys=keys)) as c:
        for path in ("/v1/models", "/v1/models/m"):
            assert (await c.get(path)).status_code == 401, path
            good = {"Authorization": "Bearer alice-secret"}
            assert (await c.get(path, headers=good)).status_code == 200, path
        spec = (await c.get("/openapi.json")).json()
        assert spec["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]


async def test_triton_config_gives_the_classes_as_priority_levels() -> None:
    async with client_for(app_with(embedding_model(Recorder()))) as c:
        batching = (await c.get("/v2/models/m/config")).json()["dynamic_batching"]
        assert (batching["priority_levels"], batching["default_priority_level"]) == (2, 2)
    async with client_for(app_with(embedding_model(Recorder()), classes=None)) as c:
        batching = (await c.get("/v2/models/m/config")).json()["dynamic_batching"]
        assert (batching["priority_levels"], batching["default_priority_level"]) == (0, 0)
