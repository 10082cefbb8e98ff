"""The model SPEC grammar, and loading the models that need no engine.

SPEC is one of:

* ``minilm``: the built-in all-MiniLM-L6-v2 embedding model (the ``embeddings`` extra);
* ``minilm:backend=onnx-int8,threads=1`` (or a folder or Hub id with the same options): the
  same model on another runtime (keys :data:`RUNTIME_KEYS`: ``backend``, ``device``,
  ``dtype``, ``threads``, ``cache_dir``, ``batch_size``, ``trust_remote_code``), and where it
  comes from (:data:`SOURCE_KEYS`: ``revision``);
* ``synthetic`` or ``synthetic:fixed=8ms,per_item=0.25ms,dim=8``: the seed's cost model;
* a path to a sentence-transformers model folder, or to a sequence classification model
  folder (a reranker with one label, a classifier with several; see
  :mod:`batchserve.models.kinds`): the folder's files decide the kind, or refuse it;
* a model's Hugging Face Hub id, ``org/name`` (``BAAI/bge-small-en-v1.5``), that is not a
  folder here: the folder is its snapshot in huggingface_hub's cache, downloaded where the
  network allows (:mod:`batchserve.engines.hub`); ``revision=`` names a branch, tag or
  commit (``BAAI/bge-small-en-v1.5:revision=main``);
* ``package.module:attr``: any batch function, or model object with ``__call__`` (a class is
  instantiated with no arguments). An object whose ``kind`` is the embedding kind (or its
  name, ``embedding``), with an integer ``dimension`` (and optionally ``count_tokens``), is
  served as an embedding model; one with an ``initial_cost`` (a
  :class:`~batchserve.config.CostEstimate`) starts the batcher's cost model from it and
  skips the warm-up passes.

This module reads every SPEC (names, options, :class:`LoadedModel`) and loads the two
kinds that run in the process as they are: the synthetic model and an imported object.
``minilm`` and a model folder run on an engine (PyTorch, ONNX Runtime, OpenVINO), picked
and loaded by the engines' layer above the core: :func:`batchserve.engines.loader.load_model`
loads any SPEC, and is what the server and the command line call.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from batchserve.config import CostEstimate
from batchserve.errors import ConfigError
from batchserve.models.base import BatchFn
from batchserve.models.engine import Engine
from batchserve.models.kinds import EMBEDDING, GENERIC, Kind, Prompts
from batchserve.models.matryoshka import NONE_DECLARED, Matryoshka
from batchserve.models.quantize import Calibration
from batchserve.models.spare_tokenizer import SpareTokenizer
from batchserve.models.synthetic import SyntheticModel
from batchserve.units import parse_duration

__all__ = [
    "RUNTIME_KEYS",
    "SOURCE_KEYS",
    "LoadedModel",
    "default_model_name",
    "describe",
    "is_hub_id",
    "load_model",
    "needs_engine",
    "parse_synthetic",
    "runs_on_engine",
    "split_runtime",
    "with_runtime",
]

#: The options of how a ``minilm``, folder or Hub id SPEC runs, after ``:``
#: (:class:`~batchserve.engines.runtime.Runtime`'s fields).
RUNTIME_KEYS = (
    "backend",
    "device",
    "dtype",
    "threads",
    "cache_dir",
    "batch_size",
    "trust_remote_code",
    "cuda_graphs",
    "pooling",
)
#: The options of where a SPEC's files come from: a Hub id's revision.
SOURCE_KEYS = ("revision",)
_OPTION_KEYS = RUNTIME_KEYS + SOURCE_KEYS
# A Hub id: org/name, each part letters, digits, '_', '-', '.' (huggingface_hub's rule).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
# The base ends at the first ':' that is followed by KEY= (a device may hold a ':').
_OPTIONS = re.compile(r"^(.+?):([A-Za-z_]+=.*)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedModel:
    """A model ready to serve, with what the protocols need to know of it.

    Attributes:
        spec: the SPEC it was loaded from.
        fn: the batch function.
        kind: what it is (:class:`~batchserve.models.kinds.Kind`): an embedder (text in,
            float vector out), a reranker (a (query, passage) pair in, one logit out), a
            classifier (a text or pair in, one logit per label out) or generic (anything).
        dimension: length of each embedding, if known.
        count_tokens: tokens per input as it ran (special tokens included, after
            truncation), for ``usage`` and the truncation count; None counts words.
        untruncated_tokens: tokens per input before truncation (special tokens included):
            the count ``truncate: false`` refuses by, and what tells a cut input from one
            that fills the window exactly. None: the model cannot tell (nothing is refused,
            nothing is counted as truncated).
        max_input_tokens: inputs longer than this are truncated by the model, if known.
        initial_cost: the model's known cost per forward pass, to start the batcher's cost
            model with (None: unknown, measured by a warm-up or learned from traffic).
        workers: forward passes to run at once to use the machine, where the model knows
            (``minilm`` or a folder: :func:`batchserve.engines.runtime.default_workers`);
            the server's default when ``--workers`` is not set. None: one.
        engine: how ``minilm`` or a folder runs (``backend``, ``precision``, ``device``,
            ``threads``) and, under ``--backend auto``, ``choice``: the verdict and the
            table behind it (:meth:`batchserve.engines.verdict.Verdict.to_dict`). None for
            other models.
        labels: a reranker's or classifier's label per logit, in order (``id2label``).
        prompts: an embedding model's named prompts and its default (a folder's
            ``config_sentence_transformers.json``); None: it defines none.
        pooling: an embedding model's pooling as its folder states it (``mean``, ``cls``,
            ``max``, ``lasttoken``, ``weightedmean``, ``mean_sqrt_len_tokens``; several
            joined by ``+``); None: not known.
        normalized: whether an embedding model's vectors are unit length as it returns
            them (a folder ending in a ``Normalize`` module, the synthetic model); None:
            not known. A route asked for unit vectors (TEI's ``normalize``, the default)
            scales only those not known to be.
        on_engine: the model as it runs on an engine (``minilm`` or a folder: its
            tokenizer, token counts and pass statistics,
            :class:`~batchserve.models.engine.Engine`); None for other models.
        matryoshka: the output dimensions an embedding model's folder declares it was
            trained for (:mod:`batchserve.models.matryoshka`); none for other models.
        calibration: an embedding model's calibration embeddings, whose ranges quantize
            its int8 and uint8 answers (:mod:`batchserve.models.quantize`; embedded at
            load by the served engine); None: not calibrated (those types are refused).
        spare_tokenizer: a copy of its engine's tokenizer for the routes that tokenize
            outside a pass (made at load, :mod:`batchserve.models.spare_tokenizer`); None
            off an engine.
    """

    spec: str
    fn: BatchFn
    kind: Kind = GENERIC
    dimension: int | None = None
    count_tokens: Callable[[Sequence[Any]], list[int]] | None = None
    untruncated_tokens: Callable[[Sequence[Any]], list[int]] | None = None
    max_input_tokens: int | None = None
    initial_cost: CostEstimate | None = None
    workers: int | None = None
    engine: dict[str, Any] | None = None
    labels: tuple[str, ...] = ()
    prompts: Prompts | None = None
    pooling: str | None = None
    normalized: bool | None = None
    on_engine: Engine | None = None
    matryoshka: Matryoshka = NONE_DECLARED
    calibration: Calibration | None = None
    spare_tokenizer: SpareTokenizer | None = None


def parse_synthetic(spec: str) -> SyntheticModel:
    """Build a SyntheticModel from ``synthetic[:fixed=8ms,per_item=0.25ms,dim=8]``.

    ``dim=0`` answers the seed's ``embedding(<input>)`` strings instead of vectors.

    Raises:
        ConfigError: an unknown key or a malformed value; the message names it.
    """
    _, _, rest = spec.partition(":")
    fixed_s, per_item_s, dim = 0.008, 0.00025, 8
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"synthetic model option must be KEY=VALUE, got {part!r}")
        if key == "fixed":
            fixed_s = parse_duration(value, name="synthetic fixed")
        elif key == "per_item":
            per_item_s = parse_duration(value, name="synthetic per_item")
        elif key == "dim":
            if not value.isdigit():
                raise ConfigError(f"synthetic dim must be an integer >= 0, got {value!r}")
            dim = int(value)
        else:
            raise ConfigError(
                f"unknown synthetic model option {key!r}; known: fixed, per_item, dim"
            )
    return SyntheticModel(fixed_s, per_item_s, dimension=dim or None)


def is_hub_id(base: str) -> bool:
    """Whether ``base`` (a SPEC without its options) names a model on the Hugging Face Hub.

    An ``org/name`` (huggingface_hub's rule for a repository id) that is not a path here:
    a folder of that name is the folder, as TEI, Infinity and vLLM read it.
    """
    return (
        _HUB_ID.match(base) is not None
        and "--" not in base
        and ".." not in base
        and not os.path.exists(base)
    )


def runs_on_engine(base: str) -> bool:
    """Whether ``base`` (a SPEC without its options) runs on an engine and takes options.

    ``minilm``, a model folder, or a Hub id (:func:`is_hub_id`).
    """
    return base == "minilm" or os.path.isdir(base) or is_hub_id(base)


def split_runtime(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``minilm:backend=onnx,threads=1`` into ``minilm`` and its options.

    Only ``minilm``, model folders and Hub ids take options (:data:`RUNTIME_KEYS` and
    :data:`SOURCE_KEYS`); any other SPEC comes back whole, with no options.

    Raises:
        ConfigError: an option is unknown or not KEY=VALUE; the message names it.
    """
    match = _OPTIONS.match(spec)
    if match is None or not runs_on_engine(match.group(1)):
        return spec, {}
    base, rest = match.group(1), match.group(2)
    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not value:
            raise ConfigError(f"model option must be KEY=VALUE, got {part!r} in {spec!r}")
        if key not in _OPTION_KEYS:
            raise ConfigError(
                f"unknown model option {key!r} in {spec!r}; known: {', '.join(_OPTION_KEYS)}"
            )
        options[key] = value
    return base, options


def with_runtime(spec: str, options: dict[str, str]) -> str:
    """``spec`` with ``options`` added (they override the SPEC's own).

    Raises:
        ConfigError: ``spec`` takes no options (it is not ``minilm``, a folder or a Hub id).
    """
    base, own = split_runtime(spec)
    if not options:
        return spec
    if not runs_on_engine(base):
        raise ConfigError(
            f"{', '.join(sorted(options))} apply to minilm, a model folder or a Hub id, "
            f"not {spec!r}"
        )
    merged = {**own, **options}
    return base + ":" + ",".join(f"{k}={merged[k]}" for k in _OPTION_KEYS if k in merged)


def needs_engine(spec: str) -> bool:
    """Whether ``spec`` runs on an engine: ``minilm``, a model folder or a Hub id.

    Such a SPEC is loaded by :func:`batchserve.engines.loader.load_model`; any other by
    :func:`load_model` here.
    """
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return False
    return runs_on_engine(split_runtime(spec)[0])


def load_model(spec: str) -> LoadedModel:
    """Load a SPEC that needs no engine: the synthetic model or ``package.module:attr``.

    Args:
        spec: what to load (see the module docstring).

    Raises:
        ConfigError: the spec names nothing loadable, or it runs on an engine (``minilm``,
            a model folder: load it with :func:`batchserve.engines.loader.load_model`); the
            message says why.
    """
    if spec == "synthetic" or spec.startswith("synthetic:"):
        model = parse_synthetic(spec)
        kind = EMBEDDING if model.dimension else GENERIC
        return LoadedModel(
            spec=spec,
            fn=model,
            kind=kind,
            dimension=model.dimension,
            initial_cost=CostEstimate(fixed_s=model.fixed_s, per_item_s=model.per_item_s),
            normalized=True,  # its vectors are unit length
        )
    if needs_engine(spec):
        raise ConfigError(
            f"model spec {spec!r} runs on an engine: load it with "
            "batchserve.engines.loader.load_model"
        )
    if ":" in spec:
        return describe(spec, _import_callable(spec))
    raise ConfigError(
        "model spec must be 'minilm', 'synthetic[:fixed=..,per_item=..]', a model folder, "
        f"a Hub id 'org/name' or 'package.module:attr', got {spec!r}"
    )


def describe(spec: str, fn: BatchFn) -> LoadedModel:
    """What the protocols need to know of the model object ``fn``, read from its attributes.

    An object declares itself an embedding model with a ``kind`` of
    :data:`~batchserve.models.kinds.EMBEDDING` (or its name) and an integer ``dimension``
    (an embedding engine qualifies; it may state ``max_seq_length``, ``pooling`` and
    ``normalized``, see :class:`~batchserve.models.engine.Engine`); anything else is
    generic. One that states its cost (``initial_cost``, a
    :class:`~batchserve.config.CostEstimate`) is not warmed up to measure it. An embedding
    model may also say how it counts tokens (``count_tokens``, ``untruncated_tokens``,
    ``max_seq_length``) and that its vectors are unit length (``normalized = True``).
    """
    cost = getattr(fn, "initial_cost", None)
    initial_cost = cost if isinstance(cost, CostEstimate) else None
    dimension = getattr(fn, "dimension", None)
    count = getattr(fn, "count_tokens", None)
    declared = getattr(fn, "kind", None)
    is_embedding = (
        declared is EMBEDDING
        or declared == EMBEDDING.name
        or (isinstance(dimension, int) and callable(count))
    )
    if not is_embedding or not isinstance(dimension, int) or isinstance(dimension, bool):
        return LoadedModel(spec=spec, fn=fn, initial_cost=initial_cost)
    max_tokens = getattr(fn, "max_seq_length", None)
    untruncated = getattr(fn, "untruncated_tokens", None)
    pooling = getattr(fn, "pooling", None)
    normalized = getattr(fn, "normalized", None)
    return LoadedModel(
        spec=spec,
        fn=fn,
        kind=EMBEDDING,
        dimension=dimension,
        count_tokens=count if callable(count) else None,
        untruncated_tokens=untruncated if callable(untruncated) else None,
        max_input_tokens=max_tokens if isinstance(max_tokens, int) else None,
        initial_cost=initial_cost,
        pooling=pooling if isinstance(pooling, str) else None,
        normalized=normalized if isinstance(normalized, bool) else None,
    )


def default_model_name(spec: str) -> str:
    """The name a model is served under when only its SPEC is given.

    ``minilm`` -> ``all-MiniLM-L6-v2``; ``synthetic:...`` -> ``synthetic``; a folder or a
    Hub id -> its last path component; ``package.module:attr`` -> ``attr``.
    """
    spec = split_runtime(spec)[0]
    if spec == "minilm":
        return "all-MiniLM-L6-v2"
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return "synthetic"
    if ":" in spec and not os.path.isdir(spec):
        return spec.rpartition(":")[2].rpartition(".")[2] or "model"
    name = os.path.basename(os.path.normpath(spec))
    return re.sub(r"[^A-Za-z0-9._-]", "-", name).lstrip("._-") or "model"


def _import_callable(spec: str) -> BatchFn:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"model spec {spec!r}: cannot import module {module_name!r}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"model spec {spec!r}: {module_name!r} has no attribute {attr!r}"
            ) from None
    if inspect.isclass(obj):
        obj = obj()
    if not callable(obj):
        raise ConfigError(f"model spec {spec!r}: {attr!r} is not callable")
    fn: BatchFn = obj
    return fn
