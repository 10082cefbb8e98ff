"""The quality gate, run once per model, engine and text set, and remembered.

Theory of operation: an engine other than torch float32 is served by ``auto`` only if its
embeddings keep their meaning and behave as an index needs them to
(:mod:`batchserve.engines.quality`: cosine to float32, the nearest passage kept, each
neighbour paragraph's nearest and ten nearest kept, the same vector for a text alone and
in a batch). Measuring that costs one pass over the gate's texts for the reference and one
for the candidate, so both are cached beside the model's exports::

    CACHE/<name>-<model hash, 16 hex>/
        reference-<texts hash>.npy          torch float32's embeddings of one part
        gate/<backend>-<dtype>-<set hash>.json   one engine's figures

The reference is kept in two parts, each keyed by the digest of its texts: the shipped set
(texts, queries, passages) and the neighbour paragraphs (:func:`default_quality_set` takes
them from the running Python's reference manual). It is computed once per model and part,
whoever asks first (the paragraphs: about 1,450 texts, a minute or two of one core); each
engine's figures once per engine. For the built-in model the shipped set's part also
ships with the package (``data/reference-<model hash>-<set hash>.npy``, written by
:func:`write_shipped_reference`; a test checks it against a fresh computation); the
paragraphs' part cannot ship, as their text follows the Python version.

The reference engine goes through the gate too, against its own vectors: its figures are
1 by definition, except its batch invariance, which is measured as any engine's is, and
its edges: every engine, the reference included, is held to ``SentenceTransformer.encode``
itself, text by text, on the texts at the model's edges (:mod:`batchserve.engines.edges`;
cached in the same folder).

A file is written to a temporary name and renamed into place, so a reader never sees half
of one; two processes that race compute the same thing twice and
the last rename wins.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines import edges
from batchserve.engines.export import model_folder, write_atomic, write_cached
from batchserve.engines.hardware import REFERENCE, Engine
from batchserve.engines.model import EngineModel
from batchserve.engines.quality import Embed, Quality, against, all_texts, embed_all, itself
from batchserve.engines.quality_set import QualitySet, neighbour_paragraphs
from batchserve.engines.quality_set import load as load_quality_set
from batchserve.engines.quality_set import read as read_quality_set
from batchserve.errors import ConfigError

__all__ = [
    "QUALITY_SET_ENV",
    "default_quality_set",
    "gate",
    "gate_named",
    "reference_vectors",
    "set_digest",
    "write_shipped_reference",
]

#: A file of one's own texts for the gate (JSON like the shipped set, or lines).
QUALITY_SET_ENV = "BATCHSERVE_QUALITY_SET"
_log = logging.getLogger(__name__)


def set_digest(qs: QualitySet) -> str:
    """A short hex digest of a quality set's texts (its neighbours included)."""
    return _digest(all_texts(qs))


def _digest(texts: list[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()[:12]


def default_quality_set(environ: dict[str, str] | None = None) -> QualitySet:
    """The gate's texts: the file ``$BATCHSERVE_QUALITY_SET`` names, else the shipped set.

    The shipped set comes with the neighbour paragraphs of Python's reference manual
    (:func:`~batchserve.engines.quality_set.neighbour_paragraphs`); a file of one's own
    brings its own (a JSON file's ``neighbours``), or none.

    Raises:
        ConfigError: the file holds no text or a malformed field.
    """
    env = os.environ if environ is None else environ
    path = env.get(QUALITY_SET_ENV)
    if path:
        return read_quality_set(Path(path))
    return dataclasses.replace(load_quality_set(), neighbours=neighbour_paragraphs())


def reference_vectors(
    source: Path,
    cache_dir: Path,
    qs: QualitySet,
    *,
    threads: int | None = None,
    workers: int = 1,
    reference: Embed | None = None,
) -> npt.NDArray[np.float32]:
    """The unit embeddings by torch float32 of every text of ``qs``, computed once and cached.

    In the order of :func:`~batchserve.engines.quality.all_texts`. Blocks while computing
    a part that is not cached (about a minute of one core for the shipped set, as much for
    the paragraphs), with ``workers`` passes of ``threads`` threads at once, by
    ``reference`` (the torch float32 engine already loaded) or, if None, one loaded here.
    """
    folder = model_folder(source, cache_dir)
    core = dataclasses.replace(qs, neighbours=())
    shipped = _shipped_reference(folder.name, core)
    parts = [_part(source, folder, all_texts(core), shipped, threads, workers, reference)]
    if qs.neighbours:
        parts.append(_part(source, folder, list(qs.neighbours), None, threads, workers, reference))
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _part(
    source: Path,
    folder: Path,
    texts: list[str],
    shipped: Path | None,
    threads: int | None,
    workers: int,
    reference: Embed | None,
) -> npt.NDArray[np.float32]:
    # One part of the reference: the cache's file, else the package's, else computed.
    path = folder / f"reference-{_digest(texts)}.npy"
    for candidate in (path, shipped):
        if candidate is None:
            continue
        try:
            vectors: npt.NDArray[np.float32] = np.load(candidate)
            if vectors.shape[0] == len(texts):
                return vectors
        except (OSError, ValueError):
            pass  # missing or damaged: the next, or computed below
    return _compute_reference(
        source, texts, path, threads=threads, workers=workers, reference=reference
    )


def _compute_reference(
    source: Path,
    texts: list[str],
    path: Path,
    *,
    threads: int | None,
    workers: int,
    keep: Callable[[Path, bytes], object] = write_cached,
    reference: Embed | None = None,
) -> npt.NDArray[np.float32]:
    # torch float32 embeds every text; the vectors are saved to path.
    if reference is None:
        from batchserve.engines.embeddings import on_torch
        from batchserve.engines.runtime import Runtime

        reference = on_torch(
            source, Runtime(backend="torch", device="cpu", dtype="float32", threads=threads)
        )
    vectors = embed_all(reference, texts, workers=workers)
    buf = io.BytesIO()
    np.save(buf, vectors)
    keep(path, buf.getvalue())
    return vectors


def _shipped_reference(model: str, qs: QualitySet) -> Path:
    key = model.rpartition("-")[2]
    return Path(__file__).parent / "data" / f"reference-{key}-{set_digest(qs)}.npy"


def write_shipped_reference(source: Path, *, workers: int = 2) -> Path:
    """Compute torch float32's embeddings of the shipped set for ``source``, into the package.

    Run once when the built-in model or the shipped set changes, as
    ``write_shipped_reference(builtin_path())``; returns the file written.
    """
    qs = load_quality_set()
    with tempfile.TemporaryDirectory() as tmp:
        name = model_folder(source, Path(tmp)).name
    path = _shipped_reference(name, qs)
    _compute_reference(source, all_texts(qs), path, threads=1, workers=workers, keep=write_atomic)
    return path


def gate(
    source: Path,
    engine: Engine,
    candidate: Embed,
    cache_dir: Path,
    *,
    quality_set: QualitySet | None = None,
    threads: int | None = None,
    workers: int = 1,
    reference: Embed | None = None,
) -> Quality:
    """``engine``'s quality figures (see :mod:`batchserve.engines.quality`), cached.

    Args:
        source: the model folder (its hash keys the cache).
        engine: the engine ``candidate`` runs (its name keys the figures).
        candidate: the engine's batch function.
        cache_dir: the cache folder.
        quality_set: the texts; None takes :func:`default_quality_set`.
        threads: CPU threads of the reference's passes, if it must be computed.
        workers: passes at once (the candidate's and the reference's).
        reference: the torch float32 engine, if loaded (its vectors, and its library's
            on the edge texts, are then computed without loading the model again).

    Blocks while embedding the set with ``candidate`` (and the reference, the first time):
    for MiniLM on one core, about a minute per engine for the shipped set and the
    paragraphs (the reference engine: its invariance and edges only, seconds).
    """
    qs = quality_set if quality_set is not None else default_quality_set()
    digest = set_digest(qs)
    path = (
        model_folder(source, cache_dir) / "gate" / f"{engine.backend}-{engine.dtype}-{digest}.json"
    )
    if path.is_file():
        try:
            return Quality.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError):
            pass  # a damaged file: measured again below
    if engine == REFERENCE:  # against itself: 1 by definition, but for its invariance
        quality = itself(candidate, qs)
        library = candidate.library if isinstance(candidate, EngineModel) else None
    else:
        ref = reference_vectors(
            source, cache_dir, qs, threads=threads, workers=workers, reference=reference
        )
        quality = against(ref, candidate, qs, workers=workers, precision=engine.dtype)
        library = reference.library if isinstance(reference, EngineModel) else None
    quality = dataclasses.replace(
        quality, edges=edges.check(source, engine, candidate, cache_dir, library=library)
    )
    write_cached(path, json.dumps(quality.to_dict(), indent=1).encode())
    kept = "-" if quality.nearest_kept is None else f"{quality.nearest_kept:.1%}"
    overlap = "-" if quality.top10_overlap is None else f"{quality.top10_overlap:.3f}"
    _log.warning(
        "%s quality gate in %.0fs: mean cosine %.4f (min %.6f) over %d texts, nearest "
        "passage kept for %.1f%% of %d queries, nearest neighbour kept %s and top-10 "
        "overlap %s over %d paragraphs, batch invariance %.6f over %d texts: %s",
        engine,
        quality.seconds,
        quality.mean_cosine,
        quality.min_cosine,
        quality.texts,
        quality.ranking_agreement * 100,
        quality.queries,
        kept,
        overlap,
        quality.neighbours,
        quality.invariance,
        quality.probes,
        "passed" if quality.passes else "FAILED (" + "; ".join(quality.failures()) + ")",
    )
    return quality


def gate_named(
    source: Path,
    engine: Engine,
    candidate: Embed,
    cache_dir: Path,
    *,
    threads: int | None = None,
    workers: int = 1,
    library: Any = None,
) -> dict[str, Any]:
    """The gate of an engine named on purpose (``--backend X``): its figures, or a refusal.

    At float32 (and for torch at any precision) the engine is held to the library on the
    model's edge texts (:func:`batchserve.engines.edges.check`: seconds, once per model and
    engine): a float32 engine that misses the floor on one is refused, naming the text and
    the figure (a float32 vector is never served wrong); a torch half-precision one is
    served with a warning. An exported engine at a reduced precision goes through the whole
    gate (:func:`gate`, cached), as before: refused when it loses the meaning, served with a
    warning when it only fails the index-shaped bounds or the per-text floor.

    Args:
        source: the model folder.
        engine: the engine named.
        candidate: its batch function.
        cache_dir: the cache folder.
        threads: CPU threads of the reference's passes, if they must be computed.
        workers: passes at once.
        library: a loaded ``SentenceTransformer`` of ``source`` at float32 to hold the
            engine to (None loads one, the first time).

    Returns:
        The figures, JSON-ready (what ``/status`` shows as the engine's ``gate``).

    Raises:
        ConfigError: the engine is refused; the message gives the figures.
    """
    if engine.dtype == "float32" or engine.backend == "torch":
        figures = edges.check(source, engine, candidate, cache_dir, library=library)
        _log.warning(
            "%s on %s's edge texts: cosine to sentence-transformers >= %.6f over %d texts "
            "(worst: %s)",
            engine,
            source.name,
            figures.min_cosine,
            figures.texts,
            figures.worst,
        )
        if not figures.passes:
            failed = "; ".join(figures.failures())
            if engine.dtype == "float32":
                use = (
                    "serve it with --backend torch"
                    if engine.backend != "torch"
                    else "batchserve's pipeline does not reproduce this folder"
                )
                raise ConfigError(
                    f"backend {engine.backend} at float32 does not give {source.name}'s "
                    f"vectors ({failed}); {use}"
                )
            _log.warning(
                "backend %s at %s is served as asked, but --backend auto would not choose it: %s",
                engine.backend,
                engine.dtype,
                failed,
            )
        return {"edges": figures.to_dict()}
    quality = gate(source, engine, candidate, cache_dir, threads=threads, workers=workers)
    if not quality.servable:
        raise ConfigError(
            f"backend {engine.backend} at {engine.dtype} failed the quality gate on the "
            f"shipped text set ({'; '.join(quality.failures(index=False))}); use "
            "float32 or --backend auto"
        )
    if not quality.passes:
        _log.warning(
            "backend %s at %s is served as asked, but --backend auto would not choose it: %s",
            engine.backend,
            engine.dtype,
            "; ".join(quality.failures()),
        )
    return quality.to_dict()
