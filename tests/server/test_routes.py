"""The route grammar (``/v2/models/{name}[/versions/{v}]/...``) and the one route table."""

import pytest
from server_helpers import build_app

from batchserve.models.kinds import BY_NAME, CLASSIFIER, EMBEDDING, MULTIVECTOR, RERANKER
from batchserve.server.protocols.catalog import INFERENCE, kinds_of
from batchserve.server.routes import model_path
from batchserve.server.statuses import ApiError


@pytest.mark.parametrize(
    ("path", "parsed"),
    [
        ("/v2/models/m", ("m", None, ())),
        ("/v2/models/m/infer", ("m", None, ("infer",))),
        ("/v2/models/m/versions/1/infer", ("m", "1", ("infer",))),
        ("/v2/models/m/versions/2", ("m", "2", ())),
        ("/v2/models/m/versions/infer", ("m", "infer", ())),
        ("/v2/models/m/a/b/infer", ("m", None, ("a", "b", "infer"))),
        ("/v2/health/ready", None),
        ("/v1/embeddings", None),
    ],
)
def test_model_path(path: str, parsed: tuple[str, str | None, tuple[str, ...]] | None) -> None:
    assert model_path(path) == parsed


def test_inference_route_takes_the_infer_paths_and_nothing_else() -> None:
    app = build_app({"m": "synthetic:fixed=0ms,per_item=0ms,dim=4"})
    infer = app.inference_route("POST", "/v2/models/m/infer")
    assert infer is not None
    assert infer[1] == "m"
    assert app.inference_route("POST", "/v2/models/m/versions/1/infer") == infer
    # a version not served is not an exchange: the routes answer 404 naming the versions
    assert app.inference_route("POST", "/v2/models/m/versions/2/infer") is None
    with pytest.raises(ApiError, match="has no version '2'; served versions: 1"):
        app.routes.resolve("POST", "/v2/models/m/versions/2/infer")
    # an unknown model is: its 404 names the models served
    assert app.inference_route("POST", "/v2/models/x/versions/2/infer") is not None
    embeddings = app.inference_route("POST", "/v1/embeddings")
    assert embeddings is not None
    assert embeddings[1] is None
    for method, path in [
        ("GET", "/v2/models/m/infer"),
        ("POST", "/v2/models/m/versions/infer"),
        ("POST", "/v2/models/m/a/b/infer"),
        ("POST", "/v2/models/m/ready"),
        ("POST", "/v1/models"),
    ]:
        assert app.inference_route(method, path) is None, (method, path)


def test_every_inference_route_is_one_row_its_endpoint_and_its_405_from_it() -> None:
    app = build_app({"m": "synthetic:fixed=0ms,per_item=0ms,dim=4"})
    paths = [route.path.replace("{name}", "m") for route in INFERENCE]
    assert len(set(paths)) == len(paths)
    for route, path in zip(INFERENCE, paths, strict=True):
        found = app.inference_route(route.method, path)
        assert found is not None, path
        assert found[1] == ("m" if "{name}" in route.path else None)
        assert app.inference_route("DELETE", path) is None
        with pytest.raises(ApiError, match=f"takes .*{route.method}, got DELETE") as refused:
            app.routes.resolve("DELETE", path)
        assert refused.value.reason == "method_not_allowed"


def test_the_kinds_of_a_path_are_the_kinds_table_s() -> None:
    # /predict is a classifier's own route, which a reranker also answers: preferred first.
    assert kinds_of("/predict") == (CLASSIFIER, RERANKER)
    assert kinds_of("/v2/rerank") == (RERANKER, MULTIVECTOR)
    assert kinds_of("/embed") == (EMBEDDING,)
    assert kinds_of("/") is None  # each model answers its own task there
    for kind in BY_NAME.values():
        for route in kind.routes:
            method, path = route.split(" ")
            kinds = kinds_of(path, method)
            assert kinds is not None
            assert kind in kinds
