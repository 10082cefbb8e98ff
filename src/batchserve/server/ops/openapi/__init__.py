"""The OpenAPI 3.1 description of every endpoint.

The inference operations are written from the route table and the request bodies from
their one description, which the parsers read too; the rest from the same constants the
server uses (the status table, the header names), so the documented contract and the
behaviour cannot drift apart silently: tests compare the routes the app serves with the
paths listed here. The ``/docs`` page is
rendered from it (:mod:`batchserve.server.ops.docs_page`).

One module a part: the shared pieces (:mod:`~batchserve.server.ops.openapi.common`), the
inference routes, one operation per row of the route table
(:mod:`~batchserve.server.ops.openapi.inference`; their bodies' schemas come from the
bodies' one description, :mod:`batchserve.server.protocols.bodies`), the other components
(:mod:`~batchserve.server.ops.openapi.schemas`), the routes that describe the server
(:mod:`~batchserve.server.ops.openapi.metadata`), Triton's extensions and the operations
endpoints (:mod:`~batchserve.server.ops.openapi.operations`); this module assembles them.
"""

from __future__ import annotations

from typing import Any

from batchserve import __version__
from batchserve.server.deadlines import TIMEOUT_HEADER, WHEN_HEADER
from batchserve.server.exchange import TIMING_HEADERS
from batchserve.server.ops.openapi.common import error_responses
from batchserve.server.ops.openapi.inference import inference_paths
from batchserve.server.ops.openapi.metadata import metadata_paths
from batchserve.server.ops.openapi.operations import operation_paths, operation_schemas
from batchserve.server.ops.openapi.schemas import inference_schemas
from batchserve.server.protocols.fields import Served
from batchserve.server.settings import RequestLimits

__all__ = ["openapi_spec"]

_DESCRIPTION = (
    "A model server built around dynamic batching. Every inference answer carries the headers "
    + ", ".join(TIMING_HEADERS)
    + "; every error carries X-Reason, and refusals (429, 503) carry Retry-After and "
    f"Retry-After-Ms. A request's deadline: the header {TIMEOUT_HEADER} (or {WHEN_HEADER}, "
    "grpc-timeout, x-envoy-expected-rq-timeout-ms), counted from its first byte. Every "
    "inference answer, refusals included, carries Server-Timing: the server's own time for "
    "the request, arrival to answer."
)

_BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "Needed only when the server runs with --api-key (or BATCHSERVE_API_KEY); "
    "health, metrics and docs stay open.",
}


def openapi_spec(
    models: list[str],
    *,
    secured: bool = True,
    limits: RequestLimits | None = None,
    dimensions: list[int] | None = None,
    prompts: list[str] | None = None,
    calibrated: bool = True,
    any_prefix: bool = False,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the server serving ``models``.

    Args:
        models: the served models' names.
        secured: whether inference and model listing need the API key (``--api-key``); the
            document states it only then.
        limits: the request limits, stated in the schemas (the defaults if None).
        dimensions: the embedding dimensions the served models accept, if known: their own
            and those they declare (OpenAI's ``dimensions`` takes one of them).
        any_prefix: ``dimensions`` takes any value up to the largest (a model declares any
            prefix; ``--any-dimensions`` in ``limits`` says so too).
        prompts: the names of the prompts the served embedding models define: a
            ``prompt_name`` takes one of them.
        calibrated: whether a served embedder has calibration ranges: int8 and uint8
            embeddings are stated only then.
    """
    security: dict[str, Any] = {"security": [{"bearer": []}]} if secured else {}
    served = Served(
        models=tuple(models),
        limits=limits if limits is not None else RequestLimits(),
        dimensions=tuple(sorted(set(dimensions or []))),
        prompts=tuple(sorted(set(prompts or []))),
        calibrated=calibrated,
        any_prefix=any_prefix,
    )
    model_param = {"name": "name", "in": "path", "required": True, "schema": {"enum": models}}
    paths = inference_paths(security, served, model_param)
    for path, operations in (
        *metadata_paths(security, served, model_param).items(),
        *operation_paths(model_param, lambda rs: error_responses(rs, "KServeError")).items(),
    ):
        paths.setdefault(path, {}).update(operations)
    paths = {path: dict(sorted(operations.items())) for path, operations in paths.items()}
    return {
        "openapi": "3.1.0",
        "info": {"title": "batchserve", "version": __version__, "description": _DESCRIPTION},
        "paths": paths,
        "components": {
            "schemas": {**inference_schemas(served), **operation_schemas()},
            "securitySchemes": {"bearer": _BEARER},
        },
    }
