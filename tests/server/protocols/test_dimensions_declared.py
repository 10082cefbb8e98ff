"""``dimensions`` checked against what the model declares it was trained for (Matryoshka).

A folder declares its dimensions in ``config.json`` (``matryoshka_dimensions``, or
``is_matryoshka: true`` for any prefix, as vLLM reads them) or sentence-transformers'
``truncate_dim``; a value it does not declare is refused on every embedding route (422,
naming the field and the values it declares) unless the server runs with
``--any-dimensions``; a model declaring none accepts only its own dimension.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import build_app, client_for, embedding_model

from batchserve.models.loader import LoadedModel
from batchserve.models.matryoshka import Matryoshka, declared
from batchserve.server import RequestLimits
from batchserve.server.protocols.dimensions import allowed_dimensions, check_declared_dimensions
from batchserve.server.statuses import ApiError
from engine_fixtures import Zoo


def _unit(texts: list[str]) -> Any:
    out = np.array([[len(t) + 1.0, 1.0, 2.0, 3.0, 0.5, 0.25, 1.5, 2.5] for t in texts])
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def _write(folder: Path, name: str, data: dict[str, Any]) -> None:
    (folder / name).write_text(json.dumps(data))


def test_declared_reads_config_and_sentence_transformers(tmp_path: Path) -> None:
    assert declared(tmp_path) == Matryoshka()  # no files: nothing declared
    _write(tmp_path, "config.json", {"matryoshka_dimensions": [256, 64, 128, "x", True]})
    assert declared(tmp_path) == Matryoshka(dimensions=(64, 128, 256))
    _write(tmp_path, "config_sentence_transformers.json", {"truncate_dim": 32})
    assert declared(tmp_path).dimensions == (32, 64, 128, 256)
    # vLLM: is_matryoshka without a list allows any prefix; with one, the list rules.
    _write(tmp_path, "config.json", {"is_matryoshka": True})
    assert declared(tmp_path).any_prefix
    _write(tmp_path, "config.json", {"is_matryoshka": True, "matryoshka_dimensions": [4]})
    assert declared(tmp_path) == Matryoshka(dimensions=(4, 32))
    (tmp_path / "config.json").write_text("{not json")
    assert declared(tmp_path).dimensions == (32,)


def test_the_check_names_the_field_and_the_values_declared() -> None:
    strict, loose = RequestLimits(), RequestLimits(any_dimensions=True)
    trained = embedding_model(_unit, dim=8, matryoshka=Matryoshka(dimensions=(2, 4, 16)))
    assert allowed_dimensions(trained) == (2, 4, 8)  # 16 is over its own: not offered
    for ok in (None, 2, 4, 8):
        check_declared_dimensions(ok, trained, strict)
    with pytest.raises(ApiError) as info:
        check_declared_dimensions(3, trained, strict, field="output_dimension")
    err = info.value
    assert (err.status, err.reason, err.param) == (422, "invalid", "output_dimension")
    assert "must be one of 2, 4, 8" in err.message
    assert "--any-dimensions" in err.message
    check_declared_dimensions(3, trained, loose)  # the operator allows any prefix
    with pytest.raises(ApiError, match="over the model's own"):
        check_declared_dimensions(9, trained, loose)
    plain = embedding_model(_unit, dim=8)
    with pytest.raises(ApiError, match=r"must be one of 8 .*declares no Matryoshka"):
        check_declared_dimensions(4, plain, strict)
    anything = embedding_model(_unit, dim=8, matryoshka=Matryoshka(any_prefix=True))
    assert allowed_dimensions(anything) is None
    check_declared_dimensions(3, anything, strict)


def _posts(c: Any, dims: int) -> list[Any]:
    return [
        c.post("/v1/embeddings", json={"input": "abc", "dimensions": dims}),
        c.post("/embeddings", json={"input": "abc", "dimensions": dims}),
        c.post("/embed", json={"inputs": "abc", "dimensions": dims}),
        c.post("/embed", json={"inputs": "abc", "parameters": {"dimensions": dims}}),
    ]


@pytest.mark.parametrize("any_dimensions", [False, True])
async def test_every_embedding_route_refuses_an_undeclared_value(any_dimensions: bool) -> None:
    model = embedding_model(_unit, dim=8, normalized=True, matryoshka=Matryoshka(dimensions=(4,)))
    app = build_app({"m": model}, limits=RequestLimits(any_dimensions=any_dimensions))
    async with client_for(app) as c:
        for r in [await p for p in _posts(c, 4)] + [await p for p in _posts(c, 8)]:
            assert r.status_code == 200, r.text
        for r in [await p for p in _posts(c, 3)]:
            if any_dimensions:
                assert r.status_code == 200, r.text
                continue
            assert r.status_code == 422, r.text
            assert r.headers["x-reason"] == "invalid"
            assert "dimensions must be one of 4, 8" in r.text
        for r in [await p for p in _posts(c, 9)]:  # over its own: refused whatever the flag
            assert r.status_code == 422, r.text
        # Cohere's output_dimension, named as Cohere names it.
        for dims, status in ((4, 200), (3, 200 if any_dimensions else 422)):
            r = await c.post("/v2/embed", json={"texts": ["abc"], "output_dimension": dims})
            assert r.status_code == status, r.text
        if not any_dimensions:
            assert "output_dimension must be one of 4, 8" in r.text
        # Infinity's 0 is the model's own dimension.
        r = await c.post("/embeddings", json={"input": "abc", "dimensions": 0})
        assert r.status_code == 200
        assert len(r.json()["data"][0]["embedding"]) == 8


def test_a_folder_declaring_dimensions_is_loaded_with_them(zoo: Zoo, tmp_path: Path) -> None:
    from batchserve.engines.loader import load_model

    folder = tmp_path / "mrl"
    shutil.copytree(zoo.folder("bert-cls"), folder)
    config = json.loads((folder / "config.json").read_text())
    _write(folder, "config.json", {**config, "matryoshka_dimensions": [8, 16]})
    loaded: LoadedModel = load_model(f"{folder}:backend=torch,threads=1")
    assert loaded.matryoshka == Matryoshka(dimensions=(8, 16))
    assert allowed_dimensions(loaded) == (8, 16, loaded.dimension)
    plain = load_model(f"{zoo.folder('bert-cls')}:backend=torch,threads=1")
    assert allowed_dimensions(plain) == (plain.dimension,)


def test_serve_any_dimensions_flag_and_config_key(tmp_path: Path) -> None:
    from batchserve.cli import build_parser
    from batchserve.cli.serve import build_settings

    def limits(*argv: str) -> RequestLimits:
        args = build_parser().parse_args(["serve", *argv])
        return build_settings(args, environ={}).limits

    assert limits().any_dimensions is False
    assert limits("--any-dimensions").any_dimensions is True
    config = tmp_path / "c.toml"
    config.write_text("any_dimensions = true\n")
    assert limits("--config", str(config)).any_dimensions is True


async def test_the_openai_client_gets_the_refusal_naming_the_values() -> None:
    openai = pytest.importorskip("openai")
    import httpx

    model = embedding_model(_unit, dim=8, normalized=True, matryoshka=Matryoshka(dimensions=(4,)))
    app = build_app({"m": model})
    async with client_for(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport) as http:
            client = openai.AsyncOpenAI(
                base_url="http://batchserve/v1", api_key="none", http_client=http
            )
            ok = await client.embeddings.create(model="m", input="abc", dimensions=4)
            with pytest.raises(openai.UnprocessableEntityError) as info:
                await client.embeddings.create(model="m", input="abc", dimensions=3)
    assert len(ok.data[0].embedding) == 4
    assert info.value.param == "dimensions"
    assert "must be one of 4, 8" in info.value.message


@pytest.mark.parametrize("any_dimensions", [False, True])
async def test_the_document_states_the_values_taken(any_dimensions: bool) -> None:
    model = embedding_model(_unit, dim=8, matryoshka=Matryoshka(dimensions=(4,)))
    app = build_app({"m": model}, limits=RequestLimits(any_dimensions=any_dimensions))
    async with client_for(app) as c:
        spec = (await c.get("/openapi.json")).json()
    field = spec["components"]["schemas"]["EmbeddingsRequest"]["properties"]["dimensions"]
    infinity = spec["components"]["schemas"]["InfinityEmbeddingsRequest"]["properties"]
    if any_dimensions:
        assert field["maximum"] == 8
        assert "enum" not in field
    else:
        assert field["enum"] == [4, 8, None]
        assert infinity["dimensions"]["enum"] == [0, 4, 8, None]
