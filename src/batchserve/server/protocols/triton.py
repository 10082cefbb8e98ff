"""Triton's extensions to KServe v2: model configuration, statistics, repository index.

These are what Triton's own tools read before and after they send a single request:
``perf_analyzer`` fetches a model's configuration (its ``max_batch_size`` decides the shape
of what it sends, the presence of ``dynamic_batching`` how it reports) and the statistics
before and after each measurement window; ``tritonclient`` exposes all three as
``get_model_config``, ``get_inference_statistics`` and ``get_model_repository_index``.

Nothing here is made up for the occasion. The configuration is the server's settings in
force: the batcher's ``max_batch_size``, ``max_wait`` as ``max_queue_delay_microseconds``,
the queue's size and the default deadline as the queue policy, the workers as the instance
count, and the inputs and outputs the model's KServe metadata declares (the batch axis left
out of ``dims``, as Triton writes it when ``max_batch_size > 0``: the texts of an embedding
model, ``[-1, 1]``, are ``dims [1]``). Its ``parameters`` (strings, as Triton's are) say
what the model is and how it runs: ``kind`` (``embedding``, ``reranker``, ``classifier``,
``generic``) and ``item``, what one item is (``pair`` for a reranker, ``text`` for an
embedder or a classifier; :func:`~batchserve.models.kinds.item_of`), once it is loaded;
``engine``, ``device``, ``threads`` and ``engine_choice`` for a model on an engine.

The statistics come from the server's own accounting (:meth:`Metrics.account
<batchserve.server.ops.metrics.Metrics.account>`), in Triton's units (counts, nanoseconds):

* ``success``: requests answered 200, and their time from arrival to answer;
* ``fail``: requests that reached the model's batcher and did not succeed (late, refused,
  expired, cancelled, failed: not ``invalid`` ones, which never got that far);
* ``queue`` and ``compute_infer``: per **item**, since batchserve splits a request of N rows
  into N items that may run in different passes: each item's wait from admission to its
  pass, and its pass's duration. With one row per request (``perf_analyzer``'s default
  batch size of 1) items and requests are the same;
* ``compute_input`` and ``compute_output``: counted as ``compute_infer`` with 0 ns, because
  a batchserve forward pass includes preparing its inputs and outputs; the request's
  parsing and encoding fall in what ``perf_analyzer`` calls overhead;
* ``batch_stats``: per batch size, the passes and their forward time;
* ``inference_count`` and ``execution_count``: items run, and passes.

Items are in the model's unit (the configuration's ``item``): a reranker's
``inference_count``, ``queue`` and ``compute_infer`` count **pairs**, one per (query,
passage) pair, so a rerank request of one query and N passages adds N to each; an
embedder's and a classifier's count texts.
"""

from __future__ import annotations

import json
from typing import Any

from batchserve.models.kinds import item_of
from batchserve.server.account import Account
from batchserve.server.protocols.kserve import model_metadata
from batchserve.server.registry import ServedModel
from batchserve.server.statuses import ApiError

__all__ = ["VERSION", "check_version", "model_config", "model_statistics", "repository_index"]

#: The one version every model is served under.
VERSION = "1"

#: KServe datatypes as Triton's model configuration names them.
_CONFIG_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BF16": "TYPE_BF16",
    "BYTES": "TYPE_STRING",
}

#: Outcomes Triton would count as failed inferences (``invalid`` never reached the model).
_FAILED = ("late", "rejected", "expired", "cancelled", "failed")

_STATES = {"ready": "READY", "loading": "LOADING", "failed": "UNAVAILABLE"}


def check_version(name: str, version: str | None) -> None:
    """Accept no version or the served one.

    Raises:
        ApiError: ``not_found`` naming the versions served.
    """
    if version is not None and version != VERSION:
        raise ApiError(
            "not_found",
            f"model {name!r} has no version {version!r}; served versions: {VERSION}",
            param="version",
        )


def _tensor(spec: dict[str, Any], *, output: bool) -> dict[str, Any]:
    # The metadata's shape includes the batch axis; the configuration's dims do not.
    dims = list(spec["shape"][1:])
    entry: dict[str, Any] = {
        "name": spec["name"],
        "data_type": _CONFIG_TYPES.get(spec["datatype"], "TYPE_INVALID"),
        "dims": dims or [1],
        "is_shape_tensor": False,
    }
    if not dims:
        entry["reshape"] = {"shape": []}
    if output:
        entry["label_filename"] = ""
    else:
        entry.update(format="FORMAT_NONE", allow_ragged_batch=False, optional=False)
    return entry


def model_config(model: ServedModel) -> dict[str, Any]:
    """``GET /v2/models/{name}/config``: Triton's model configuration, as served now."""
    meta = model_metadata(model.name, model.loaded)
    batch = model.config
    classes = model.classes
    return {
        "name": model.name,
        "platform": "batchserve",
        "backend": "batchserve",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": batch.max_batch_size,
        "input": [_tensor(t, output=False) for t in meta["inputs"]],
        "output": [_tensor(t, output=True) for t in meta["outputs"]],
        "batch_input": [],
        "batch_output": [],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": round(batch.max_wait_s * 1e6),
            # One worker answers passes in the order they were formed, oldest first.
            "preserve_ordering": batch.workers == 1,
            # Levels are the classes of work, most urgent first (X-Priority or
            # parameters.priority: 1 = the first); none without classes.
            "priority_levels": 0 if classes is None else len(classes.classes),
            "default_priority_level": 0
            if classes is None
            else classes.names.index(classes.default_class.name) + 1,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": round(model.settings.timeout_s * 1e6),
                "allow_timeout_override": True,
                "max_queue_size": batch.queue_size,
            },
        },
        "instance_group": [
            {"name": model.name, "kind": "KIND_MODEL", "count": batch.workers, "gpus": []}
        ],
        "default_model_filename": "",
        "parameters": {
            "spec": {"string_value": model.settings.spec},
            "admission": {"string_value": "on" if batch.admission else "off"},
            **_kind_parameters(model),
            **_engine_parameters(model),
        },
        "model_warmup": [],
    }


def _kind_parameters(model: ServedModel) -> dict[str, dict[str, str]]:
    # What the model is, and the unit its items (and so the statistics) are counted in.
    if model.loaded is None:
        return {}
    out: dict[str, dict[str, str]] = {"kind": {"string_value": model.loaded.kind.name}}
    item = item_of(model.loaded.kind)
    if item is not None:
        out["item"] = {"string_value": item}
    return out


def _engine_parameters(model: ServedModel) -> dict[str, dict[str, str]]:
    # How minilm or a folder runs, and under --backend auto the choice and its table (JSON
    # in a string parameter: Triton's parameters are strings).
    engine = model.loaded.engine if model.loaded is not None else None
    if not engine:
        return {}
    out = {
        "engine": {"string_value": f"{engine['backend']}/{engine['precision']}"},
        "device": {"string_value": str(engine["device"])},
        "threads": {"string_value": str(engine["threads"])},
    }
    choice = engine.get("choice")
    if choice:
        trials = {
            f"{t['backend']}/{t['precision']}": {
                "items_per_s": t["items_per_s"],
                "gated": t["gated"],
                "unavailable": t["unavailable"],
            }
            for t in choice["trials"]
        }
        out["engine_choice"] = {"string_value": json.dumps(trials, separators=(",", ":"))}
    return out


def _duration(count: int, seconds: float) -> dict[str, int]:
    return {"count": count, "ns": round(seconds * 1e9)}


def model_statistics(name: str, account: Account) -> dict[str, Any]:
    """One model's entry of ``GET /v2/models/{name}/stats`` (see the module docstring)."""
    items = account.items
    failed = sum(account.count(o) for o in _FAILED)
    fail_s = sum(account.other_s.get(o, 0.0) for o in _FAILED)
    last = account.last_pass_unix
    return {
        "name": name,
        "version": VERSION,
        "last_inference": round(last * 1e3) if last is not None else 0,
        "inference_count": items,
        "execution_count": account.passes,
        "inference_stats": {
            "success": _duration(account.count("ok"), account.success_s),
            "fail": _duration(failed, fail_s),
            "queue": _duration(items, account.queue_wait_s),
            "compute_input": _duration(items, 0.0),
            "compute_infer": _duration(items, account.item_forward_s),
            "compute_output": _duration(items, 0.0),
            "cache_hit": _duration(0, 0.0),
            "cache_miss": _duration(0, 0.0),
        },
        "response_stats": {},
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration(passes, 0.0),
                "compute_infer": _duration(passes, seconds),
                "compute_output": _duration(passes, 0.0),
            }
            for size, (passes, seconds) in account.by_size.items()
        ],
        "memory_usage": [],
    }


def repository_index(models: list[ServedModel], *, ready_only: bool) -> list[dict[str, str]]:
    """``POST /v2/repository/index``: every model with its version, state and reason."""
    index = []
    for m in models:
        if ready_only and not m.ready:
            continue
        reason = ""
        if m.error is not None:
            reason = f"{type(m.error).__name__}: {m.error}"
        index.append(
            {
                "name": m.name,
                "version": VERSION,
                "state": _STATES.get(m.state, "UNKNOWN"),
                "reason": reason,
            }
        )
    return index
