"""Loading any model SPEC, the ones that run on an engine included.

``minilm``, a sentence-transformers model folder and a sequence classification folder (a
reranker or a classifier, :mod:`batchserve.models.kinds`) run on an engine: PyTorch, ONNX
Runtime or OpenVINO, at a precision, on a device, with a number of CPU threads (a
:class:`~batchserve.engines.runtime.Runtime`, from the command line and the SPEC's own
options, ``minilm:backend=onnx-int8,threads=1``). With the default backend ``auto`` every
engine the machine offers is measured once and the fastest that passes the quality gate is
served (:mod:`batchserve.engines.choice`; a reranker's or classifier's engines are timed on
pairs or texts and gated by the ranking or labels they keep,
:class:`~batchserve.engines.ranking_gate.SequenceJudge`); the verdict is cached.

Which folder a SPEC names is decided here, once, for every entry point (``serve``,
``profile``, config files): ``minilm`` is the shipped folder, a path is itself, a Hub id
(``org/name``, with ``revision=``) is its snapshot in huggingface_hub's cache, downloaded
where the network allows (:mod:`batchserve.engines.hub`). The folder's kind is read from
its files before anything is loaded, and a folder batchserve does not serve (a masked-LM
head, a causal LM, an image or audio model, a sparse encoder of modules other than
SPLADE's, code of its own that it was not told to trust) is refused then, saying what was found
(:meth:`~batchserve.models.kinds.FolderKind.check`).

Every other SPEC (the synthetic model, ``package.module:attr``) is handed to the core's
:func:`batchserve.models.loader.load_model`, which also holds the SPEC grammar and
:class:`~batchserve.models.loader.LoadedModel`. The server and the command line load
through this module, so that one call loads anything a user can name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

from batchserve.engines.heads import VectorHead
from batchserve.engines.model import EngineModel
from batchserve.engines.runtime import Runtime, default_workers
from batchserve.errors import ConfigError
from batchserve.models import loader as models_loader
from batchserve.models import matryoshka
from batchserve.models.kinds import (
    EMBEDDING,
    SERVES,
    Kind,
    Logits,
    Sparse,
    Tensors,
    Tokens,
    Vector,
    folder_kind,
    splade_kind,
)
from batchserve.models.loader import (
    SOURCE_KEYS,
    LoadedModel,
    is_hub_id,
    needs_engine,
    split_runtime,
)
from batchserve.models.spare_tokenizer import SpareTokenizer

if TYPE_CHECKING:
    from batchserve.engines.verdict import Verdict

__all__ = ["choose_engine", "load_model", "model_folder"]

_log = logging.getLogger(__name__)


def load_model(spec: str, runtime: Runtime | None = None) -> LoadedModel:
    """Load the model named by ``spec`` (see :mod:`batchserve.models.loader`).

    Blocks while the model loads (seconds for MiniLM; an ONNX or OpenVINO backend's first
    load also exports it into the cache); call it off the event loop.

    Args:
        spec: what to load.
        runtime: how to run ``minilm`` or a model folder; options in ``spec`` override it.

    Raises:
        ConfigError: the spec names nothing loadable; the message says why.
        ImportError: the ``embeddings`` extra is missing (the message names the pip command).
    """
    if not needs_engine(spec):
        return models_loader.load_model(spec)
    base, options = split_runtime(spec)
    path = model_folder(base, options.get("revision"))
    rt = _runtime(options, runtime)
    found = folder_kind(path)
    if rt.pooling is not None:  # --pooling splade: a bare masked-LM folder is sparse
        found = splade_kind(path, found)
    where = base if base == str(path) else f"{base} ({path})"
    found.check(where, trust_remote_code=rt.trust_remote_code)
    if found.remote_code:
        # No engine passes trust_remote_code to transformers yet: loaded without it, the
        # folder would run the architecture transformers knows by its model_type (when it
        # knows one), not this model's code. Refused until they do.
        raise ConfigError(
            f"{where}: --trust-remote-code is set, but batchserve's engines do not run a "
            f"folder's own code yet ({', '.join(found.remote_code)}); serve it where its "
            "code runs, or a folder whose architecture transformers has"
        )
    _refuse_unknown_type(path, where)
    choice: dict[str, Any] | None = None
    if found.llm:  # an LLM reranker: torch only (engines.llm_rerank)
        from batchserve.engines import llm_rerank

        if rt.exported:
            raise llm_rerank.refuse_exported(where, rt.backend)
        engine = llm_rerank.on_torch(path, dataclasses.replace(rt, backend="torch"))
        return _loaded(spec, engine, found.kind, choice=None)
    if rt.backend == "auto" and found.kind.gate is not None:
        engine, verdict = choose_engine(path, rt)
        choice = verdict.to_dict()
    else:
        engine = _load_engine(path, rt, kind=found.kind)
    loaded = _loaded(spec, engine, found.kind, choice=choice)
    if found.kind is EMBEDDING:  # what dimensions its routes accept
        loaded = dataclasses.replace(loaded, matryoshka=matryoshka.declared(path))
    return loaded


def _refuse_unknown_type(path: Path, where: str) -> None:
    # A model_type transformers does not know fails deep in the load with a ValueError
    # about checkpoints; said at start instead, with what batchserve serves.
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no config.json at the top (an older layout): the load says what it finds
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str):
        return
    import transformers

    if model_type not in transformers.CONFIG_MAPPING:
        raise ConfigError(
            f"{where}: config.json's model_type {model_type!r} is an architecture "
            f"transformers {transformers.__version__} does not know, so no engine can build "
            f"it; {SERVES}"
        )


def _loaded(
    spec: str, engine: EngineModel, kind: Kind, *, choice: dict[str, Any] | None
) -> LoadedModel:
    # What the protocols read of a model on an engine: its fields, and the engine itself.
    head = engine.head
    pipeline = head.pipeline if isinstance(head, VectorHead) else None
    description: dict[str, Any] = {
        "backend": engine.backend,
        "precision": engine.dtype,
        "device": engine.device,
        "threads": engine.threads,
        "choice": choice,
        "gate": engine.gate,
    }
    if pipeline is not None:
        description["pipeline"] = pipeline.describe()
    prompts = pipeline.prompts if pipeline is not None else None
    return LoadedModel(
        spec=spec,
        fn=engine,
        kind=kind,
        dimension=engine.dimension if pipeline is not None else None,
        count_tokens=engine.count_tokens,
        untruncated_tokens=engine.untruncated_tokens,
        max_input_tokens=engine.max_seq_length,
        workers=default_workers(engine.device, engine.threads),
        engine=description,
        labels=engine.labels,
        prompts=prompts if prompts is not None and prompts.prompts else None,
        pooling=engine.pooling,
        normalized=engine.normalized,
        on_engine=engine,
        spare_tokenizer=SpareTokenizer(engine.tokenizer),  # no pass runs yet: a safe copy
    )


def model_folder(base: str, revision: str | None = None) -> Path:
    """The folder a SPEC's base names: ``minilm``'s, a path, or a Hub id's snapshot.

    Blocks while a Hub id downloads (see :mod:`batchserve.engines.hub`).

    Raises:
        ConfigError: a revision for what is not a Hub id, a Hub id that cannot be had
            (the message names the id, the revision and the cache), or no such folder.
    """
    if is_hub_id(base):
        from batchserve.engines.hub import resolve

        return resolve(base, revision)
    if revision is not None:
        raise ConfigError(
            f"revision={revision} names a revision on the Hugging Face Hub; {base!r} is not "
            "a Hub id (org/name) but a folder here or the built-in model"
        )
    if base == "minilm":
        from batchserve.engines.embeddings import builtin_path

        return builtin_path()
    if not os.path.isdir(base):
        raise ConfigError(f"no model folder {base!r} here")
    return Path(base)


def _gate_sequence(path: Path, fn: EngineModel, rt: Runtime) -> dict[str, Any]:
    # An exported reranker or classifier is served only if it keeps the torch engine's
    # ranking or labels on the shipped set (engines.ranking_gate); else the load fails.
    from batchserve.engines import sequence
    from batchserve.engines.hardware import Engine
    from batchserve.engines.quality_set import load as load_quality_set
    from batchserve.engines.ranking_gate import SequenceJudge

    reference = sequence.on_torch(
        path, dataclasses.replace(rt, backend="torch", device="cpu", dtype="auto")
    )
    verdict = SequenceJudge(fn.kind, load_quality_set()).gate(
        Engine(rt.backend, fn.dtype), fn, reference
    )  # at float32: every score within 1e-4, every order and label kept
    _log.warning("%s %s gate: %s", path.name, rt.backend, verdict.summary())
    if not verdict.passed:
        raise ConfigError(
            f"backend {rt.backend} fails the quality gate for {path.name}: "
            f"{verdict.summary()}; serve it with backend=torch"
        )
    return verdict.to_dict()


def _runtime(options: dict[str, str], base: Runtime | None) -> Runtime:
    fields: dict[str, object] = {}
    for key, value in options.items():
        if key in SOURCE_KEYS:
            continue
        if key in ("threads", "batch_size"):
            if not value.isdigit():
                raise ConfigError(f"{key} must be an integer >= 1, got {value!r}")
            fields[key] = int(value)
        elif key in ("cuda_graphs", "trust_remote_code"):
            fields[key] = _flag(key, value)
        else:
            fields[key] = value
    return dataclasses.replace(base or Runtime(), **fields)  # type: ignore[arg-type]


def _flag(key: str, value: str) -> bool:
    text = value.lower()
    if text in ("on", "true", "yes", "1"):
        return True
    if text in ("off", "false", "no", "0"):
        return False
    raise ConfigError(f"{key} must be on or off, got {value!r}")


def _load_engine(
    path: Path, rt: Runtime, *, gated: bool = True, kind: Kind = EMBEDDING
) -> EngineModel:
    # The folder's kind decides the head, the runtime the runner; an engine named on
    # purpose is gated (``auto`` gates those it may choose itself, and loads them ungated).
    match kind.head:
        case Logits():
            from batchserve.engines import sequence

            if not rt.exported:
                return sequence.on_torch(path, rt)
            fn = sequence.on_exported(path, rt)
            if gated:
                fn.gate = _gate_sequence(path, fn, rt)
            return fn
        case Vector():
            return _load_embedder(path, rt, gated=gated)
        case Sparse():
            from batchserve.engines import sparse

            return sparse.on_torch(path, rt)  # torch only: no gate judges an export yet
        case Tokens():
            from batchserve.engines import colbert

            return colbert.on_torch(path, rt)
        case Tensors():
            raise ConfigError(f"{path}: a {kind.name} model runs on no engine")
        case _:
            assert_never(kind.head)


def _load_embedder(path: Path, rt: Runtime, *, gated: bool) -> EngineModel:
    if rt.exported:
        from batchserve.engines.exported import on_exported

        return on_exported(path, rt, gated=gated)
    from batchserve.engines import embeddings
    from batchserve.engines.gate import gate_named
    from batchserve.engines.hardware import Engine

    emb = embeddings.on_torch(path, rt)
    if gated:  # held to the library on the edge texts (its own model, at float32)
        library = emb.library if emb.dtype == "float32" else None
        emb.gate = gate_named(
            path, Engine("torch", emb.dtype), emb, rt.cache_path(), library=library
        )
    return emb


def choose_engine(path: Path, rt: Runtime, *, refresh: bool = False) -> tuple[EngineModel, Verdict]:
    """``--backend auto`` for the model folder ``path``: the chosen engine, loaded, and why.

    The verdict is read from the cache, or measured (and cached) when there is none for
    this model, machine, versions and settings, or when ``refresh`` is set. Logs the
    choice (and, when measured, the table).

    Raises:
        ConfigError: the device asked for is not here.
    """
    from batchserve.engines.choice import Judge, choose
    from batchserve.engines.hardware import Engine, Machine
    from batchserve.engines.ranking_gate import GATES, SequenceJudge
    from batchserve.engines.runtime import default_threads, resolve_device

    found = folder_kind(path)
    if rt.pooling is not None:
        found = splade_kind(path, found)
    found.check(path, trust_remote_code=rt.trust_remote_code)
    if found.llm:
        raise ConfigError(
            f"{path}: an LLM reranker runs on torch only; there are no engines to measure"
        )
    kind = found.kind
    if kind.gate is None:
        raise ConfigError(
            f"{path}: a {kind.name} model is served on torch alone (no quality gate judges "
            "its exported engines), so there is no engine to choose"
        )
    judge: Judge | None = None
    if kind.gate in GATES:
        from batchserve.engines.quality_set import load as load_quality_set

        judge = SequenceJudge(kind, load_quality_set())

    machine = Machine.here()
    device = resolve_device(rt.device, cuda_devices=len(machine.cuda_devices), mps=machine.mps)
    threads = rt.threads or default_threads()

    def load(engine: Engine) -> EngineModel:
        on = device if engine.backend == "torch" else "cpu"
        return _load_engine(
            path,
            dataclasses.replace(
                rt, backend=engine.backend, dtype=engine.dtype, device=on, threads=threads
            ),
            gated=False,
            kind=kind,
        )

    verdict, fn = choose(
        path,
        device=device,
        threads=threads,
        workers=default_workers(device, threads),
        batch_size=rt.batch_size or 32,
        cache_dir=rt.cache_path(),
        load=load,
        dtype=rt.dtype,
        machine=machine,
        judge=judge,
        refresh=refresh,
        cuda_graphs=rt.cuda_graphs,
    )
    if not verdict.cached:
        _log.warning("backend auto measured every engine:\n%s", verdict.table())
    _log.warning("%s", verdict.summary())
    return (fn if isinstance(fn, EngineModel) else load(verdict.chosen)), verdict
