"""The inference routes' operations, one per row of the route table.

Each operation is written from its row (:data:`batchserve.server.protocols.catalog.INFERENCE`):
its summary, description, tag, body (its description's schema, or a component) and error
shape; what every inference answer carries (the deadline and class headers, the timing
headers, the refusals by reason) is added here.
"""

from __future__ import annotations

from typing import Any

from batchserve.server.ops.openapi.common import (
    CLASS_PARAMS,
    DEADLINE_PARAMS,
    INFER_ERRORS,
    error_responses,
    json_content,
    timing_headers,
)
from batchserve.server.protocols.catalog import INFER_PATH, INFERENCE, Route
from batchserve.server.protocols.fields import Served

__all__ = ["inference_paths"]

_COMPUTE_TOKENS = {
    "description": "The tokens the request's inputs took in their passes (after truncation, "
    "a prompt's included), as TEI's header; absent for a model that counts none.",
    "schema": {"type": "integer", "minimum": 0},
}
_TASK_NOTE = (
    " A route of another kind of model answers 400 `wrong_kind`, naming the route to use. "
    "Inputs over the model's window are truncated (counted in `X-Truncated-Inputs`) unless "
    "`truncate` is false."
)
_HEADER_LENGTH = {
    "name": "Inference-Header-Content-Length",
    "in": "header",
    "required": False,
    "description": "Bytes of JSON before the binary tensor data.",
    "schema": {"type": "integer"},
}


def _ref(component: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{component}"}


def _operation(
    route: Route, security: dict[str, Any], served: Served, model_param: dict[str, Any]
) -> dict[str, Any]:
    ok: dict[str, Any] = {
        "description": "One answer per input, in order.",
        "headers": timing_headers(),
    }
    parameters = [*DEADLINE_PARAMS, *CLASS_PARAMS]
    body = route.body
    content = json_content(_ref(body) if isinstance(body, str) else body.schema(served))
    description = route.description
    if route.answer is None:  # a task route: its answer's shape is the original server's
        description += _TASK_NOTE
        ok["headers"]["X-Compute-Tokens"] = _COMPUTE_TOKENS
        ok["content"] = json_content({})
    else:
        ok["content"] = json_content(_ref(route.answer))
    if route.path == INFER_PATH:  # Triton's binary tensor data, after the JSON
        parameters = [model_param, *parameters, _HEADER_LENGTH]
        content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    return {
        "summary": route.summary,
        "description": description,
        "tags": [route.tag],
        **security,
        "parameters": parameters,
        "requestBody": {"required": True, "content": content},
        "responses": {"200": ok, **error_responses([*INFER_ERRORS, *route.refuses], route.error)},
    }


def inference_paths(
    security: dict[str, Any], served: Served, model_param: dict[str, Any]
) -> dict[str, Any]:
    """The inference routes' operations, by path and method.

    ``security`` as the inference routes have it; ``served`` what the bodies' schemas
    state of the deployment; ``model_param`` the ``{name}`` parameter.
    """
    paths: dict[str, Any] = {}
    for route in INFERENCE:
        operation = _operation(route, security, served, model_param)
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return paths
