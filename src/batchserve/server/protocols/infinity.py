"""Infinity's own routes: ``POST /embeddings``, ``GET /models`` and ``GET /health``'s body.

Infinity (michaelfeil/infinity, ``infinity_emb/infinity_server.py``) serves its API at the
root: ``/embeddings``, ``/rerank``, ``/classify``, ``/models`` and ``/health``. Its rerank
and classify shapes are in :mod:`~batchserve.server.protocols.rerankers`; these are the
rest, so ``infinity_client`` (and code written against an Infinity URL) runs unchanged.

* ``POST /embeddings``: OpenAI's embeddings shape (:mod:`~batchserve.server.protocols.openai`,
  the same parsing and answer) with Infinity's differences: ``dimensions: 0`` (what
  ``infinity_client`` sends by default) means the model's own; ``modality`` must be
  ``text`` (images and audio are refused, naming the field); the placeholder model name
  ``default/not-specified`` and any name with one model served reach the embedder, as
  Infinity resolves them; an empty text is embedded, as Infinity does (OpenAI's route
  refuses it); the answer adds Infinity's ``id`` and ``created``; errors are Infinity's
  ``{"error": {...}}`` with FastAPI's ``detail`` list, which its client parses on a 422.
* ``GET /models``: ``{object: "list", data: [{id, object, created, stats, backend,
  capabilities, ...}]}``, each model's ``stats`` its queue (``queue_fraction``,
  ``queue_absolute``, ``results_pending``, ``batch_size``) and ``capabilities`` what its
  kind answers (``embed``, ``rerank``, ``classify``). ``owned_by`` is left out:
  Infinity's generated client accepts only ``"infinity"`` there, and absent.
* ``GET /health``: ``{"unix": seconds}``, Infinity's body; the route is also TEI's, whose
  clients read only the status (see :mod:`batchserve.server.routes`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from batchserve.models.kinds import BY_NAME
from batchserve.server.http import load_json
from batchserve.server.protocols.bodies import INFINITY_EMBEDDINGS
from batchserve.server.protocols.openai import (
    EmbeddingsEndpoint,
    EmbeddingsRequest,
    embeddings_request,
)
from batchserve.server.protocols.rerankers import infinity_error_body
from batchserve.server.protocols.tasks import route_model
from batchserve.server.registry import ServedModel
from batchserve.server.statuses import ApiError

__all__ = [
    "CAPABILITIES",
    "DEFAULT_MODEL",
    "InfinityEmbeddingsEndpoint",
    "health_body",
    "models_response",
]

#: The model name ``infinity_client`` sends when none is given.
DEFAULT_MODEL = "default/not-specified"
#: What each kind of model answers (by its name), in Infinity's words (its
#: ``ModelCapabilites``).
CAPABILITIES = {name: list(kind.tasks) for name, kind in BY_NAME.items() if kind.tasks}
_CREATED = int(time.time())


class InfinityEmbeddingsEndpoint(EmbeddingsEndpoint):
    """``POST /embeddings`` as an exchange's endpoint (see the module docstring)."""

    protocol = "infinity"
    route = "POST /embeddings"

    def request(self, body: bytes) -> EmbeddingsRequest:
        """The checked request, Infinity's fields read as Infinity reads them.

        See :data:`~batchserve.server.protocols.bodies.INFINITY_EMBEDDINGS`.

        Raises:
            ApiError: ``invalid`` or ``too_large``, naming the field.
        """
        data = load_json(body)
        if isinstance(data, dict) and data.get("model") == DEFAULT_MODEL:
            data = {**data, "model": None}
        long = len(body) > self.limits.max_input_chars
        return embeddings_request(data, self.limits, body=INFINITY_EMBEDDINGS, long=long)

    def model(self, name: str | None) -> ServedModel:
        """The model named; else, as Infinity resolves it, the one served or the embedder.

        Raises:
            ApiError: 404 for a name not served among several models.
        """
        return route_model(self.registry, name, self.kinds)

    def extra(self) -> bytes:
        """Infinity's ``id`` and ``created``."""
        return b',"id":"infinity-%s","created":%d' % (
            str(uuid.uuid4()).encode(),
            int(time.time()),
        )

    def error_body(self, error: ApiError) -> bytes:
        """Infinity's error shape, with FastAPI's ``detail``."""
        return infinity_error_body(error)


def models_response(models: Sequence[ServedModel]) -> dict[str, Any]:
    """``GET /models``: every served model as Infinity lists it (see the module docstring)."""
    return {"object": "list", "data": [_entry(m) for m in models]}


def _entry(model: ServedModel) -> dict[str, Any]:
    loaded = model.loaded
    engine = (loaded.engine if loaded is not None else None) or {}
    config = model.config
    stats = model.batcher.statistics() if model.batcher is not None else None
    depth = stats.queue_depth if stats is not None else 0
    entry: dict[str, Any] = {
        "id": model.name,
        "object": "model",
        "created": _CREATED,
        "stats": {
            "queue_fraction": depth / config.queue_size,
            "queue_absolute": depth,
            "results_pending": stats.running_items if stats is not None else 0,
            "batch_size": config.max_batch_size,
        },
        "backend": engine.get("backend", ""),
        "capabilities": list(loaded.kind.tasks) if loaded is not None else [],
        "kind": loaded.kind.name if loaded is not None else None,
        "state": model.state,
    }
    for key, name in (("precision", "dtype"), ("device", "device")):
        if key in engine:
            entry[name] = engine[key]
    return entry


def health_body() -> dict[str, float]:
    """Infinity's ``/health`` answer: the server's time, Unix seconds."""
    return {"unix": time.time()}
