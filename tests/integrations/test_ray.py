"""Ray Serve hosting batchserve: the policy with plain numbers, a replica in-process, and a
real local Ray instance with 2 replicas.

The live test starts Ray with 2 CPUs (no dashboard), deploys a sleeping model (20 ms
passes) on 2 replicas behind Ray's HTTP proxy on a free port, and checks that requests
meet batchserve's own machinery there: the OpenAI and KServe routes, batches of several
requests, a bounded queue that refuses with a reason and Retry-After, a deadline refused
at once. Its rates are low (tens of requests); it takes about 30 s, mostly Ray starting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from batchserve.config import BatchConfig
from batchserve.errors import ConfigError
from batchserve.integrations.ray import (
    QUEUE_DEPTH_METRIC,
    BatchserveReplica,
    QueueDepthPolicy,
    Scaling,
    deployment,
)
from batchserve.server import ModelSettings, ServerSettings
from batchserve_testing.process import free_port


def settings(queue_size: int = 64, fixed: str = "20ms") -> ServerSettings:
    batch = BatchConfig(max_batch_size=8, max_wait_s=0.005, queue_size=queue_size)
    model = ModelSettings(name="synthetic", spec=f"synthetic:fixed={fixed},dim=4", batch=batch)
    return ServerSettings(models=(model,))


def ctx(depths: dict[str, float] | None, *, target: int = 2, low: int = 1, high: int = 8) -> Any:
    return SimpleNamespace(
        aggregated_metrics=None if depths is None else {QUEUE_DEPTH_METRIC: depths},
        policy_state={"kept": 1},
        target_num_replicas=target,
        capacity_adjusted_min_replicas=low,
        capacity_adjusted_max_replicas=high,
    )


def test_policy_wants_a_replica_per_target_of_queued_items() -> None:
    policy = QueueDepthPolicy(target_queue_depth=10)
    assert policy(ctx({"a": 0.0, "b": 0.0})) == (1, {"kept": 1})
    assert policy(ctx({"a": 10.0, "b": 10.0})) == (2, {"kept": 1})
    assert policy(ctx({"a": 25.0, "b": 6.0})) == (4, {"kept": 1})
    assert policy(ctx({"a": 500.0}))[0] == 8  # the upper bound
    assert policy(ctx({"a": 0.0}, low=3))[0] == 3  # the lower bound
    assert policy(ctx(None, target=5))[0] == 5  # no report yet: keep the target


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="target_queue_depth must be > 0, got 0"):
        QueueDepthPolicy(target_queue_depth=0)
    with pytest.raises(ConfigError, match=r"max_replicas must be >= min_replicas \(2\), got 1"):
        Scaling(min_replicas=2, max_replicas=1)
    with pytest.raises(ConfigError, match="give num_replicas or scaling, not both"):
        deployment(settings(), num_replicas=2, scaling=Scaling())
    config = Scaling(min_replicas=1, max_replicas=3, target_queue_depth=16).ray_config()
    assert config["policy"] == {
        "policy_function": "batchserve.integrations.ray:QueueDepthPolicy",
        "policy_kwargs": {"target_queue_depth": 16},
    }
    assert (config["min_replicas"], config["max_replicas"]) == (1, 3)
    assert "metrics_interval_s" not in config  # Ray's default
    fast = Scaling(look_back_period_s=1.0, metrics_interval_s=0.25).ray_config()
    assert (fast["look_back_period_s"], fast["metrics_interval_s"]) == (1.0, 0.25)
    with pytest.raises(ConfigError, match=r"metrics_interval_s must be > 0 and < look_back_pe"):
        Scaling(look_back_period_s=1.0, metrics_interval_s=1.0)


async def test_a_replica_reports_its_queue_depth() -> None:
    # Passes of 1 s of at most 8 items: once all 20 requests are in, the first pass runs
    # and the rest wait, for a second, in the queue the replica reports.
    replica = BatchserveReplica(settings(fixed="1s"))
    app = replica.__serve_build_asgi_app__()

    await replica.server.start()
    await replica.server.wait_ready()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://r") as client:
        body = {"input": "x", "model": "synthetic"}
        calls = [asyncio.ensure_future(client.post("/v1/embeddings", json=body)) for _ in range(20)]
        for _ in range(500):  # until all are in and some wait (bounded: 5 s)
            if replica.server.inflight == 20 and replica.queue_depth() > 0:
                break
            await asyncio.sleep(0.01)
        depth = replica.queue_depth()
        stats = await replica.record_autoscaling_stats()
        metrics = (await client.get("/metrics")).text
        answers = await asyncio.gather(*calls)
    await replica.server.stop()
    statuses = [r.status_code for r in answers]
    assert depth >= 4  # at most 8 + 8 of the 20 in the first two passes
    assert stats == {QUEUE_DEPTH_METRIC: float(depth)}
    assert f'batchserve_queue_depth{{model="synthetic"}} {float(depth)}' in metrics
    assert statuses == [200] * 20


@pytest.fixture(scope="module")
def ray_url() -> Iterator[str]:
    import ray  # the ray extra, installed by scripts/test
    from ray import serve

    port = free_port()
    # Every Ray process on the loopback address: the test talks to nothing else.
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
    )
    try:
        app = deployment(settings(queue_size=4), num_replicas=2, ray_actor_options={"num_cpus": 0})
        # On a busy machine Ray may give up on starting its HTTP proxy: one more try.
        for attempt in range(2):
            try:
                serve.start(http_options={"host": "127.0.0.1", "port": port})
                serve.run(app, name="batchserve", route_prefix="/")
                break
            except Exception:
                if attempt:
                    raise
                serve.shutdown()
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_two_ray_replicas_serve_with_batchserves_batcher(ray_url: str) -> None:
    from ray import serve

    status = serve.status().applications["batchserve"].deployments["batchserve"]
    assert status.replica_states.get("RUNNING") == 2, status

    with httpx.Client(base_url=ray_url, timeout=10.0) as client:
        assert client.get("/v2/health/ready").status_code == 200
        r = client.post("/v1/embeddings", json={"input": "hello", "model": "synthetic"})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"][0]["embedding"]) == 4
        assert {"x-batch-size", "x-batch-id", "x-queue-wait-s"} <= set(r.headers)
        kserve = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
        r = client.post("/v2/models/synthetic/infer", json=kserve)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["shape"] == [1, 4]
        # A deadline shorter than a pass: refused at once by batchserve's admission (the
        # cost model has measured passes by now), or answered 504 at the deadline.
        for _ in range(3):
            client.post("/v1/embeddings", json={"input": "warm", "model": "synthetic"})
        r = client.post(
            "/v1/embeddings",
            json={"input": "late", "model": "synthetic"},
            headers={"X-Request-Timeout": "2ms"},
        )
        assert (r.status_code, r.headers["x-reason"]) in {
            (429, "infeasible"),
            (504, "deadline_exceeded"),
        }, r.text

    def burst(n: int) -> list[httpx.Response]:
        # n requests at once, one thread each, on a pool of n connections.
        limits = httpx.Limits(max_connections=n)
        body = {"input": "burst", "model": "synthetic"}
        with (
            httpx.Client(base_url=ray_url, timeout=10.0, limits=limits) as c,
            ThreadPoolExecutor(n) as pool,
        ):
            return list(pool.map(lambda _: c.post("/v1/embeddings", json=body), range(n)))

    # 60 requests at once on 2 replicas, each with a queue of 4 and passes of 8: batches of
    # several requests, and refusals that say why.
    t0 = time.monotonic()
    answers = burst(60)
    took = time.monotonic() - t0
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    summary = f"{len(ok)} ok, {len(refused)} refused in {took:.2f} s"
    print(
        f"burst of 60 on 2 Ray replicas: {summary}, batches up to "
        f"{max((int(r.headers['x-batch-size']) for r in ok), default=0)}"
    )
    assert len(ok) + len(refused) == 60, [r.status_code for r in answers]
    assert max(int(r.headers["x-batch-size"]) for r in ok) > 1, summary
    assert refused, summary
    for r in refused:
        assert r.headers["x-reason"] in ("queue_full", "infeasible"), r.text
        assert int(r.headers["retry-after"]) >= 1


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_ray_scales_up_on_queue_depth(ray_url: str) -> None:
    from ray import serve

    # One replica to start, passes of 1 s: a queue builds at once, and with a target of 2
    # waiting items per replica the policy asks for the second replica. The replicas push
    # their depths every 0.25 s (Ray's default, 10 s, would be most of the wait), and a
    # queue of 16 drains in 2 s once the load stops.
    scaling = Scaling(
        min_replicas=1,
        max_replicas=2,
        target_queue_depth=2,
        upscale_delay_s=0.0,
        look_back_period_s=1.0,
        metrics_interval_s=0.25,
    )
    app = deployment(
        settings(queue_size=16, fixed="1s"),
        scaling=scaling,
        name="scaled",
        ray_actor_options={"num_cpus": 0},
    )
    serve.run(app, name="scaled", route_prefix="/scaled")

    def running() -> int:
        status = serve.status().applications["scaled"].deployments["scaled"]
        return int(status.replica_states.get("RUNNING", 0))

    assert running() == 1

    def load(seconds: float) -> int:
        # 50 requests/s against 8/s served: the queue grows by 4 items a tick.
        body = {"input": "q", "model": "synthetic"}
        with (
            httpx.Client(base_url=ray_url, timeout=30.0) as c,
            ThreadPoolExecutor(64) as pool,
        ):
            calls = []
            t0 = time.monotonic()
            scaled_at = 0.0
            while time.monotonic() - t0 < seconds:
                calls += [pool.submit(c.post, "/scaled/v1/embeddings", json=body) for _ in range(5)]
                time.sleep(0.1)
                if running() == 2:
                    scaled_at = time.monotonic() - t0
                    break
            answers = [f.result() for f in calls]
        assert {r.status_code for r in answers} <= {200, 429}
        return int(scaled_at)

    scaled_after = load(60.0)
    print(f"scaled to 2 replicas after {scaled_after} s of queueing")
    assert running() == 2
    serve.delete("scaled")
