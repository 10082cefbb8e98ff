"""Sequence classification models on an engine: rerankers and classifiers.

A ``...ForSequenceClassification`` folder (as ``CrossEncoder.save`` or ``save_pretrained``
writes it; see :mod:`batchserve.models.kinds` for how the folder's kind is told) runs as an
:class:`~batchserve.engines.model.EngineModel`: a
:class:`~batchserve.engines.heads.LogitsHead` (an item is a text or a pair; one row of raw
logits per item: one value for a reranker, one per label for a classifier) composed with a
runner (:mod:`batchserve.engines.runners`): the whole model on torch (:func:`on_torch`), or
exported to ONNX Runtime or OpenVINO (:func:`on_exported`). Nothing here downloads
anything.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from batchserve.engines.cuda_graphs import mask_4d
from batchserve.engines.heads import LogitsHead
from batchserve.engines.model import EngineModel
from batchserve.engines.pipeline import MODEL_INPUTS
from batchserve.engines.runners import ExportedRunner, TorchRunner, can_capture
from batchserve.engines.runtime import Runtime, default_threads, place_exported, place_torch
from batchserve.errors import ConfigError
from batchserve.models.kinds import FolderKind, Logits, folder_kind

__all__ = [
    "EXTRA_HINT",
    "graph_step",
    "max_sequence_length",
    "on_exported",
    "on_torch",
]

EXTRA_HINT = (
    "rerankers and classifiers need the 'embeddings' extra: pip install 'batchserve[embeddings]'"
)


def max_sequence_length(path: str | Path, tokenizer_max: int | None, positions: int | None) -> int:
    """The model's window in tokens: what the folder states, bounded by what it can hold.

    ``sentence_bert_config.json``'s ``max_seq_length`` if set, else the tokenizer's
    ``model_max_length``; never more than the position embeddings, and 512 when nothing
    sensible is stated (a tokenizer saved without a limit says 10**30).
    """
    stated: int | None = None
    st_config = Path(path) / "sentence_bert_config.json"
    if st_config.is_file():
        with contextlib.suppress(OSError, ValueError):
            value = json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length")
            if isinstance(value, int) and value > 0:
                stated = value
    if stated is None and tokenizer_max is not None and 0 < tokenizer_max < 1_000_000:
        stated = tokenizer_max
    limit = positions if positions is not None and positions > 0 else 512
    return min(stated if stated is not None else 512, limit)


def on_torch(
    path: str | Path, runtime: Runtime | None = None, *, kind: FolderKind | None = None
) -> EngineModel:
    """The sequence classification model saved in the folder ``path``, on torch.

    Args:
        path: the model folder (``config.json``, weights, tokenizer files).
        runtime: device, precision, threads and CUDA graphs (backend ``torch`` or
            ``auto``).
        kind: the folder's kind, if already read (else read here).

    Raises:
        ConfigError: the folder is not a sequence classification model, or the runtime
            asks for another backend, a device that is not here or a precision the
            machine cannot compute in.
        ImportError: the ``embeddings`` extra is missing.
    """
    runtime = runtime or Runtime(backend="torch")
    if runtime.backend not in ("torch", "auto"):
        raise ConfigError(f"backend {runtime.backend} is not torch: load it with on_exported")
    kind = _sequence_kind(path, kind)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoModelForSequenceClassification
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    device, dtype = place_torch(runtime)
    tokenizer = _tokenizer(path)
    model = AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True)
    model.eval()
    model.to(device)
    if dtype in ("float16", "bfloat16"):
        model = model.to(getattr(torch, dtype))
    positions = getattr(model.config, "max_position_embeddings", None)
    head = _head(path, tokenizer, kind, positions)
    runner = TorchRunner(
        model, _logits, autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None
    )
    engine = EngineModel(runner, head)
    if runtime.cuda_graphs and can_capture(model.config, left_padded=head.left_padded):
        runner.capture_graphs(
            graph_step(model),
            check=head.check(runner.dtype in ("float16", "bfloat16")),
            shaped=head.shaped,
            window=head.window,
        )
    return engine


def on_exported(
    path: str | Path, runtime: Runtime, *, kind: FolderKind | None = None
) -> EngineModel:
    """The folder ``path`` exported to ``runtime.backend`` (ONNX Runtime or OpenVINO).

    The export is made once into the cache (:func:`batchserve.engines.export.ensure_exported`)
    and not gated here (:func:`batchserve.engines.ranking_gate.gate_sequence` does).

    Raises:
        ConfigError: the folder is not a sequence classification model, or the backend
            is not offered for it.
        ImportError: the backend's extra is missing.
    """
    from batchserve.engines.export import ensure_exported

    kind = _sequence_kind(path, kind)
    dtype = place_exported(runtime)
    done = ensure_exported(Path(path), runtime.backend, runtime.cache_path())
    threads = runtime.threads or default_threads()
    runner = ExportedRunner.open(
        done.model_file, backend=runtime.backend, threads=threads, dtype=dtype
    )
    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    head = _head(path, _tokenizer(path), kind, config.get("max_position_embeddings"))
    return EngineModel(runner, head)


def graph_step(model: Any) -> Any:
    """What a CUDA graph captures: the model's logits, its mask handed 4-D.

    So transformers prepares no mask (its preparation reads the mask's values on the CPU).
    """

    def step(static: dict[str, Any]) -> Any:
        kwargs = {name: static[name] for name in MODEL_INPUTS if name in static}
        kwargs["attention_mask"] = mask_4d(static["attention_mask"])
        return model(**kwargs).logits

    return step


def _logits(model: Any, inputs: dict[str, Any]) -> Any:
    # The whole model on one sub-pass: its logits, raw.
    return model(**inputs).logits


def _sequence_kind(path: str | Path, kind: FolderKind | None) -> FolderKind:
    found = kind or folder_kind(path)
    if not isinstance(found.kind.head, Logits):
        raise ConfigError(f"{path} is not a sequence classification model ({found.kind.name})")
    return found


def _tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _head(path: str | Path, tokenizer: Any, kind: FolderKind, positions: int | None) -> LogitsHead:
    # The folder's labels, and its window bounded by its position embeddings.
    window = max_sequence_length(path, getattr(tokenizer, "model_max_length", None), positions)
    return LogitsHead(tokenizer, kind=kind.kind, labels=kind.labels, window=window)
