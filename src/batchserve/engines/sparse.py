"""Sparse embedders on an engine: SPLADE, one weight per vocabulary term, on torch.

A sparse folder (see :mod:`batchserve.models.kinds.sparse` for how it is told) runs as an
:class:`~batchserve.engines.model.EngineModel`: a :class:`SpladeHead` (an item is a text,
tokenized as sentence-transformers tokenizes it, prompts included) composed with a
:class:`~batchserve.engines.runners.TorchRunner` whose step is the masked-LM transformer
and the folder's ``SpladePooling`` on the device: the logits times the attention mask, then
``log1p(relu(.))`` (``log1p`` twice for ``log1p_relu``), then the max or sum over tokens,
the operations ``SpladePooling.forward`` runs. Pooling on the device keeps a sub-pass's
``tokens x vocabulary`` logits off the CPU; a row is the vocabulary's width.

The decoder (the masked-LM head's last layer, vocabulary x hidden) is run by the step
itself, a chunk of the vocabulary at a time on the CPU (:func:`fused_step`): a chunk's
logits are masked and pooled while they are in the cache. A head's cost is its tokens
times the vocabulary, and without this its logits (hundreds of MiB for a sub-pass) are
written to memory and read back by each elementwise operation. With ``max`` pooling the
activation runs on the maxima alone (it never decreases, so it commutes with the max).

Padding never leaks into a row: a padded position's logits are zeroed before the
activation, so it adds zero to a sum and never raises a max (every activated value is at
least zero); a text in a batch gets the row it gets alone.

Only torch: no gate judges an exported engine's sparse rows yet, so ``--backend auto``
loads torch and an exported backend is refused (:func:`on_torch`).

What is read: ``modules.json`` (a ``Transformer`` of task ``fill-mask`` or an
``MLMTransformer``, then ``SpladePooling``), the pooling's ``config.json``
(``pooling_strategy``: ``max`` or ``sum``; ``activation_function``: ``relu`` or
``log1p_relu``), the transformer's window, tokenizer and lower-casing as
:func:`~batchserve.engines.pipeline.transformer_tokenizer` reads an embedding folder's,
and the named prompts; a bare ``...ForMaskedLM`` folder (``--pooling splade``) is what
``SparseEncoder(folder)`` builds for it: the transformer, ``max`` pooling, ``relu``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.cuda_graphs import Check, logits_within
from batchserve.engines.heads import VectorHead
from batchserve.engines.model import EngineModel
from batchserve.engines.pipeline import TextPipeline, transformer_tokenizer
from batchserve.engines.runners import TorchRunner
from batchserve.engines.runtime import Runtime, place_torch
from batchserve.errors import ConfigError
from batchserve.models.kinds import SPARSE, folder_prompts

__all__ = ["EXTRA_HINT", "Splade", "SpladeHead", "on_torch", "read_splade"]

EXTRA_HINT = "sparse embedders need the 'embeddings' extra: pip install 'batchserve[embeddings]'"

#: ``SpladePooling``'s pooling strategies and activations.
_STRATEGIES = ("max", "sum")
_ACTIVATIONS = ("relu", "log1p_relu")


@dataclass(frozen=True, slots=True, kw_only=True)
class Splade:
    """A sparse folder's files, read once: where its transformer is and how it pools.

    Attributes:
        folder: the model folder.
        transformer: the transformer's folder (its weights, config and tokenizer).
        strategy: ``max`` or ``sum`` over tokens.
        activation: ``relu`` (``log1p(relu(x))``) or ``log1p_relu`` (``log1p`` twice).
    """

    folder: Path
    transformer: Path
    strategy: str = "max"
    activation: str = "relu"


def read_splade(path: str | Path) -> Splade:
    """Where the sparse folder ``path`` keeps its transformer, and its SPLADE pooling.

    Raises:
        ConfigError: modules other than a masked-LM transformer then ``SpladePooling``, a
            transformer task other than ``fill-mask``, or a pooling batchserve does not know.
    """
    folder = Path(path)
    listing = folder / "modules.json"
    if not listing.is_file():
        return Splade(folder=folder, transformer=folder)
    entries = _read_json(listing)
    if not isinstance(entries, list):
        raise ConfigError(f"{listing} must hold a JSON list")
    modules = sorted(
        (m for m in entries if isinstance(m, dict)), key=lambda m: int(m.get("idx", 0))
    )
    types = [str(m.get("type", "")).rpartition(".")[2] for m in modules]
    if (
        len(types) != 2
        or types[0] not in ("Transformer", "MLMTransformer")
        or (types[1] != "SpladePooling")
    ):
        raise ConfigError(
            f"{listing}: modules {', '.join(types)}; a sparse encoder is served as a masked-LM "
            "Transformer (or MLMTransformer) then SpladePooling"
        )
    transformer = folder / str(modules[0].get("path") or "")
    task = _st_config(transformer).get("transformer_task", "fill-mask")
    if task != "fill-mask":
        raise ConfigError(
            f"{transformer}: transformer_task {task!r}; SpladePooling pools a fill-mask "
            "transformer's logits"
        )
    pooling_file = folder / str(modules[1].get("path") or "") / "config.json"
    pooling = _read_json(pooling_file) if pooling_file.is_file() else {}
    if not isinstance(pooling, dict):
        raise ConfigError(f"{pooling_file} must hold a JSON object")
    strategy = str(pooling.get("pooling_strategy", "max"))
    activation = str(pooling.get("activation_function", "relu"))
    if strategy not in _STRATEGIES or activation not in _ACTIVATIONS:
        raise ConfigError(
            f"{pooling_file}: pooling_strategy {strategy!r} and activation_function "
            f"{activation!r}; SpladePooling takes {' or '.join(_STRATEGIES)} and "
            f"{' or '.join(_ACTIVATIONS)}"
        )
    return Splade(folder=folder, transformer=transformer, strategy=strategy, activation=activation)


class SpladeHead(VectorHead):
    """A sparse embedder's head: texts in, one weight per vocabulary term out.

    The folder's text pipeline tokenizes (window, prompts, lower-casing); the runner's
    step pools on the device, so a row arrives finished.
    """

    kind = SPARSE

    def finish(
        self, raw: npt.NDArray[np.float32], features: Mapping[str, Any]
    ) -> npt.NDArray[np.float32]:
        """The rows as the runner's step pooled them."""
        return raw

    def check(self, half: bool) -> Check:
        """No weight moved by more than a tolerance (a looser one at 16 bits)."""
        return logits_within(0.02 if half else 1e-4)


#: Floats of logits a chunk of the fused head holds: a few MiB, so a chunk's logits are
#: pooled while in the CPU's cache instead of written to memory and read back.
_CHUNK_FLOATS = 1 << 20


def splade_step(strategy: str, activation: str) -> Any:
    """The runner's step: the masked-LM logits pooled as ``SpladePooling`` pools them.

    The whole model's logits (for a head whose decoder is not a plain linear layer). With
    ``max`` pooling the max is taken first, over the masked logits, and the activation
    applied to the maxima: ``relu`` and ``log1p`` never decrease, so the max of the
    activated logits is the activated max, the same float (a max picks one of its operands).
    """

    def step(model: Any, inputs: dict[str, Any]) -> Any:
        logits = model(**inputs).logits
        logits.mul_(inputs["attention_mask"].unsqueeze(-1).to(logits.dtype))
        return _pooled(logits, strategy, activation)

    return step


def fused_step(decoder: Any, strategy: str, activation: str, *, chunked: bool) -> Any:
    """The runner's step with the decoder taken out of the model and run here, in chunks.

    The model (its decoder replaced by an identity, :func:`_take_decoder`) answers the
    head's last hidden states; each chunk of the vocabulary's logits is computed from them
    (the decoder's rows, its bias), masked, and pooled at once, so the ``tokens x
    vocabulary`` logits never exist whole. Each weight is the same dot product and the same
    pooling as the whole model's, in the same order.

    Args:
        decoder: the model's output layer (a linear layer: vocabulary x hidden).
        strategy: ``max`` or ``sum``.
        activation: ``relu`` or ``log1p_relu``.
        chunked: cut the vocabulary into chunks (on the CPU); else one chunk (a GPU).
    """
    import torch

    weight = decoder.weight
    bias = decoder.bias
    vocabulary = int(weight.shape[0])

    def step(model: Any, inputs: dict[str, Any]) -> Any:
        hidden = model(**inputs).logits  # the head's states: the decoder is an identity
        keep = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        items, tokens = int(hidden.shape[0]), int(hidden.shape[1])
        size = vocabulary
        if chunked:
            size = min(vocabulary, max(256, _CHUNK_FLOATS // max(1, items * tokens)))
        out = hidden.new_empty((items, vocabulary))
        for begin in range(0, vocabulary, size):
            end = min(vocabulary, begin + size)
            part = torch.nn.functional.linear(
                hidden, weight[begin:end], None if bias is None else bias[begin:end]
            )
            part.mul_(keep)
            if strategy == "max":
                out[:, begin:end] = part.amax(dim=1)
            else:
                out[:, begin:end] = _pooled(part, strategy, activation)
        if strategy == "max":
            out = _activated(out, activation)
        return out

    return step


def _pooled(logits: Any, strategy: str, activation: str) -> Any:
    # Masked logits (items x tokens x terms) pooled over tokens, as SpladePooling pools them.
    if strategy == "max":
        return _activated(logits.amax(dim=1), activation)
    return _activated(logits.relu_(), activation).sum(dim=1)


def _activated(values: Any, activation: str) -> Any:
    # log1p(relu(x)), in place; log1p twice for log1p_relu.
    values = values.relu_().log1p_()
    return values.log1p_() if activation == "log1p_relu" else values


def _take_decoder(model: Any) -> Any:
    # The model's output layer, replaced in the model by an identity, if it is a plain
    # linear layer (BERT's, RoBERTa's, DistilBERT's, ModernBERT's decoder); else None.
    import torch

    decoder = model.get_output_embeddings()
    if not isinstance(decoder, torch.nn.Linear):
        return None
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is decoder:
                setattr(parent, name, torch.nn.Identity())
                return decoder
    return None


def on_torch(path: str | Path, runtime: Runtime | None = None) -> EngineModel:
    """The sparse embedder saved in the folder ``path``, on torch.

    Args:
        path: a SparseEncoder folder, or a bare ``...ForMaskedLM`` folder (served with
            ``--pooling splade``).
        runtime: device, precision and threads (backend ``torch`` or ``auto``).

    Raises:
        ConfigError: an exported backend (no gate judges sparse rows on one yet), a
            folder that is not a SPLADE model, a device that is not here or a precision
            the machine cannot compute in.
        ImportError: the ``embeddings`` extra is missing.
    """
    runtime = runtime or Runtime(backend="torch")
    if runtime.backend not in ("torch", "auto"):
        raise ConfigError(
            f"backend {runtime.backend}: a sparse embedder is served on torch only (no "
            "quality gate judges an exported engine's sparse vectors yet); use --backend "
            "torch or auto"
        )
    splade = read_splade(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoModelForMaskedLM
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    device, dtype = place_torch(runtime)
    tokenizer, lower = transformer_tokenizer(splade.transformer)
    model = AutoModelForMaskedLM.from_pretrained(str(splade.transformer), local_files_only=True)
    model.eval()
    model.to(device)
    if dtype in ("float16", "bfloat16"):
        model = model.to(getattr(torch, dtype))
    output = model.get_output_embeddings()
    weight = getattr(output, "weight", None)
    vocabulary = int(weight.shape[0]) if weight is not None else int(model.config.vocab_size)
    pipeline = TextPipeline(
        folder=splade.folder,
        layout="modules.json" if (splade.folder / "modules.json").is_file() else "save_pretrained",
        tokenizer=tokenizer,
        window=int(tokenizer.model_max_length),
        lower_case=lower,
        pooling_modes=(f"splade_{splade.strategy}",),
        include_prompt=True,
        steps=(),
        dimension=vocabulary,
        prompts=folder_prompts(splade.folder),
    )
    decoder = _take_decoder(model)
    step = (
        splade_step(splade.strategy, splade.activation)
        if decoder is None
        else fused_step(
            decoder, splade.strategy, splade.activation, chunked=str(device).startswith("cpu")
        )
    )
    runner = TorchRunner(
        model,
        step,
        autocast=dtype.removesuffix("-mixed") if "mixed" in dtype else None,
    )
    return EngineModel(runner, SpladeHead(pipeline))


def _st_config(transformer: Path) -> dict[str, Any]:
    file = transformer / "sentence_bert_config.json"
    data = _read_json(file) if file.is_file() else {}
    return data if isinstance(data, dict) else {}


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file} is not readable JSON: {exc}") from exc
