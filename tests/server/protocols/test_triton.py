"""Triton's extensions: model configuration, statistics, repository index; perf_analyzer.

In process: the configuration states the settings in force, and the statistics add up
exactly what the server told each client in its own headers (``X-Queue-Wait-S``,
``X-Forward-S``, ``Server-Timing``). Against a real server: ``tritonclient.http`` reads all
three, and Triton's ``perf_analyzer`` runs unchanged in its default mode (Triton over
HTTP), with binary and with JSON tensors, and reports the server's side from the statistics.
"""

from __future__ import annotations

import pathlib
import re
import subprocess

import httpx
import pytest
from batchserve_testmodels import double, poisoned
from server_helpers import build_app, client_for, embedding_model, server_process

from batchserve.config import BatchConfig
from batchserve.engines.loader import load_model
from batchserve.models.loader import LoadedModel
from batchserve.server import App, ModelSettings, ServerSettings
from batchserve_testing.tools import find_perf_analyzer

tritonhttp = pytest.importorskip("tritonclient.http")

TEXTS = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]}]}


async def test_workers_the_model_decides_are_the_ones_stated() -> None:
    # ``serve`` without --workers: the loaded model says how many passes use the machine.
    model = embedding_model(poisoned, dim=4, workers=3)
    settings = ServerSettings(
        models=(
            ModelSettings(name="auto", spec="auto", auto_workers=True),
            ModelSettings(name="set", spec="set", batch=BatchConfig(workers=1)),
        )
    )
    app = App(settings, loader=lambda spec: model)
    async with client_for(app) as c:
        for name, workers in (("auto", 3), ("set", 1)):
            config = (await c.get(f"/v2/models/{name}/config")).json()
            assert config["instance_group"][0]["count"] == workers, name
            assert config["dynamic_batching"]["preserve_ordering"] is (workers == 1)
            status = (await c.get("/status")).json()
            assert status["models"][name]["settings"]["workers"] == workers, name
            assert app.registry.models[name].require_batcher().config.workers == workers


async def test_config_states_the_settings_in_force() -> None:
    batch = BatchConfig(max_batch_size=7, max_wait_s=0.003, queue_size=50, workers=2)
    app = build_app(
        {"emb": embedding_model(poisoned, dim=4), "gen": LoadedModel(spec="g", fn=double)},
        batch={"emb": batch},
        timeout_s=2.5,
    )
    async with client_for(app) as c:
        meta = (await c.get("/v2")).json()
        assert {"model_configuration", "statistics"} <= set(meta["extensions"])
        config = (await c.get("/v2/models/emb/config")).json()
        assert config["name"] == "emb"
        assert config["max_batch_size"] == 7
        dyn = config["dynamic_batching"]
        assert dyn["max_queue_delay_microseconds"] == 3000
        assert dyn["preserve_ordering"] is False  # two workers
        assert dyn["default_queue_policy"]["max_queue_size"] == 50
        assert dyn["default_queue_policy"]["default_timeout_microseconds"] == 2_500_000
        assert config["instance_group"][0]["count"] == 2
        assert config["input"] == [
            {
                "name": "text",
                "data_type": "TYPE_STRING",
                "dims": [1],
                "is_shape_tensor": False,
                "format": "FORMAT_NONE",
                "allow_ragged_batch": False,
                "optional": False,
            }
        ]
        assert config["output"][0]["dims"] == [4]
        assert config["output"][0]["data_type"] == "TYPE_FP32"
        # The metadata agrees: the batch axis plus the configuration's dims.
        model = (await c.get("/v2/models/emb")).json()
        assert model["inputs"][0]["shape"] == [-1, 1]
        assert (await c.get("/v2/models/emb/versions/1/config")).json() == config
        # A generic model declares no tensors; its batching is still stated.
        gen = (await c.get("/v2/models/gen/config")).json()
        assert (gen["input"], gen["output"], gen["max_batch_size"]) == ([], [], 32)
        r = await c.get("/v2/models/emb/versions/2/config")
        assert r.status_code == 404
        assert "no version '2'" in r.json()["error"]
        for path in ("/v2/models/nope/config", "/v2/models/nope/versions/2/config"):
            r = await c.get(path)
            assert r.status_code == 404
            assert "'nope' is not served here; served: emb, gen" in r.json()["error"]
        r = await c.get("/v2/models/emb/versions/2")  # metadata too: one version
        assert r.status_code == 404


def _sum(responses: list[httpx.Response], header: str) -> float:
    return sum(float(v) for r in responses for v in r.headers[header].split(","))


def _server_s(responses: list[httpx.Response]) -> float:
    total = 0.0
    for r in responses:
        match = re.fullmatch(r"total;dur=([0-9.]+)", r.headers["server-timing"])
        assert match is not None
        total += float(match.group(1)) / 1e3
    return total


async def test_statistics_add_up_what_each_client_was_told() -> None:
    app = build_app({"emb": embedding_model(poisoned, dim=4)})
    async with client_for(app) as c:
        ok = [await c.post("/v2/models/emb/infer", json=TEXTS) for _ in range(5)]
        two = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["b", "c"]}]}
        ok.append(await c.post("/v2/models/emb/infer", json=two))
        assert [r.status_code for r in ok] == [200] * 6
        stats = (await c.get("/v2/models/emb/stats")).json()["model_stats"]
        assert [(s["name"], s["version"]) for s in stats] == [("emb", "1")]
        s = stats[0]
        inf = s["inference_stats"]
        assert inf["success"]["count"] == 6
        assert inf["fail"]["count"] == 0
        assert s["inference_count"] == inf["queue"]["count"] == 7  # items: 5 x 1 + 2
        assert inf["compute_infer"]["count"] == 7
        # To the nanosecond, up to the headers' rounding (1 us per figure).
        assert inf["queue"]["ns"] / 1e9 == pytest.approx(_sum(ok, "x-queue-wait-s"), abs=8e-6)
        assert inf["compute_infer"]["ns"] / 1e9 == pytest.approx(_sum(ok, "x-forward-s"), abs=8e-6)
        assert inf["success"]["ns"] / 1e9 == pytest.approx(_server_s(ok), abs=8e-6)
        batches = s["batch_stats"]
        assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == 7
        assert sum(b["compute_infer"]["count"] for b in batches) == s["execution_count"]
        assert s["last_inference"] > 1.7e12  # milliseconds since the epoch

        poison = {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["poison"]}]
        }
        r = await c.post("/v2/models/emb/infer", json=poison)
        assert r.status_code == 422
        r = await c.post("/v2/models/emb/infer", json={"inputs": "nope"})
        assert r.status_code == 422  # invalid: never reached the model, not a failure
        both = (await c.get("/v2/models/stats")).json()["model_stats"]
        assert both == (await c.get("/v2/models/emb/versions/1/stats")).json()["model_stats"]
        fail = both[0]["inference_stats"]["fail"]
        assert fail["count"] == 1
        assert fail["ns"] > 0
        assert (await c.get("/v2/models/emb/versions/9/stats")).status_code == 404


async def test_config_and_statistics_name_the_kind_and_count_a_reranker_s_pairs(
    reranker_folder: pathlib.Path, classifier_folder: pathlib.Path
) -> None:
    pytest.importorskip("transformers")
    kserve_grpc = pytest.importorskip("batchserve.server.protocols.kserve_grpc")
    app = build_app(
        {
            "ce": load_model(f"{reranker_folder}:backend=torch,threads=1"),
            "clf": load_model(f"{classifier_folder}:backend=torch,threads=1"),
            "emb": embedding_model(poisoned, dim=4),
            "gen": LoadedModel(spec="g", fn=double),
        }
    )
    want = {
        "ce": ("reranker", "pair"),
        "clf": ("classifier", "text"),
        "emb": ("embedding", "text"),
        "gen": ("generic", None),
    }
    async with client_for(app) as c:
        for name, (kind, item) in want.items():
            params = (await c.get(f"/v2/models/{name}/config")).json()["parameters"]
            assert params["kind"] == {"string_value": kind}, name
            assert params.get("item") == (None if item is None else {"string_value": item})
            # gRPC's ModelConfig carries the same parameters.
            grpc_params = kserve_grpc.model_config(app.registry.models[name]).config.parameters
            assert grpc_params["kind"].string_value == kind, name
            assert (grpc_params["item"].string_value if "item" in grpc_params else None) == item
        # The engine's parameters stay beside them.
        assert "engine" in (await c.get("/v2/models/ce/config")).json()["parameters"]
        # Two requests of one query and 3 and 2 passages: five pairs, counted as items.
        for docs in (["a", "b", "c"], ["d", "e"]):
            r = await c.post("/rerank", json={"model": "ce", "query": "q", "texts": docs})
            assert r.status_code == 200, r.text
        (s,) = (await c.get("/v2/models/ce/stats")).json()["model_stats"]
    inf = s["inference_stats"]
    assert inf["success"]["count"] == 2
    assert s["inference_count"] == inf["queue"]["count"] == inf["compute_infer"]["count"] == 5
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in s["batch_stats"]) == 5


async def test_repository_index_and_its_body() -> None:
    app = build_app({"a": embedding_model(poisoned), "b": embedding_model(poisoned)})
    async with client_for(app) as c:
        want = [{"name": n, "version": "1", "state": "READY", "reason": ""} for n in ("a", "b")]
        assert (await c.post("/v2/repository/index")).json() == want
        assert (await c.post("/v2/repository/index", json={"ready": True})).json() == want
        r = await c.post("/v2/repository/index", json={"ready": "yes"})
        assert r.status_code == 422
        assert "ready must be a boolean" in r.json()["error"]
        r = await c.post("/v2/repository/index", content=b"{nope")
        assert r.status_code == 400
        r = await c.get("/v2/repository/index")
        assert r.status_code == 405


def _perf_analyzer(url: str, model: str, tensor_format: str) -> dict[str, int]:
    """Run perf_analyzer at 100 requests/s for a few short windows; its figures."""
    binary, env = find_perf_analyzer()
    cmd = [
        binary,
        "-m", model,
        "-u", url.removeprefix("http://"),
        "-i", "http",
        "--request-rate-range", "100",
        "--measurement-interval", "400",
        "--stability-percentage", "60",
        "--max-trials", "6",
        "--input-tensor-format", tensor_format,
        "--output-tensor-format", tensor_format,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    figures = {}
    for key in ("Request count", "Successful request count", "Inference count"):
        match = re.search(rf"{key}: (\d+)", out)
        assert match is not None, f"no {key!r} in:\n{out}"
        figures[key] = int(match.group(1))
    # The server's side comes from the statistics extension: queue and compute are there.
    assert re.search(r"queue \d+ usec \+ compute input \d+ usec \+ compute infer \d+ usec", out)
    return figures


def test_the_readme_s_perf_analyzer_script_runs_it() -> None:
    find_perf_analyzer()
    script = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "perf_analyzer"
    done = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Perf Analyzer Version" in done.stdout + done.stderr


@pytest.mark.slow
def test_tritonclient_and_perf_analyzer_against_a_real_server() -> None:
    model = "synthetic"
    with server_process(
        ["--model", "synthetic:fixed=2ms,per_item=0.1ms", "--max-wait", "1ms"]
    ) as server:
        client = tritonhttp.InferenceServerClient(url=server.url.removeprefix("http://"))
        config = client.get_model_config(model)
        assert config["max_batch_size"] == 32
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
        assert client.get_model_repository_index() == [
            {"name": model, "version": "1", "state": "READY", "reason": ""}
        ]
        assert client.get_inference_statistics(model)["model_stats"][0]["inference_count"] == 0
        for tensor_format in ("binary", "json"):
            figures = _perf_analyzer(server.url, model, tensor_format)
            assert figures["Successful request count"] > 0
        # Every request perf_analyzer sent was served, none refused or failed.
        requests = httpx.get(server.url + "/status").json()["models"][model]["requests"]
        ok = requests["ok"]
        assert ok == sum(requests.values())
        stats = client.get_inference_statistics(model)["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == ok
        assert stats["inference_stats"]["fail"]["count"] == 0
        assert ok >= 2 * 100 * 0.4  # at least one window of each run
        client.close()
        code, err = server.stop()
    assert code == 0, err
