"""An embedding model exported to ONNX Runtime or OpenVINO: exported, gated, opened.

The folder's transformer is exported once into the cache (:mod:`batchserve.engines.export`:
its output the token embeddings) and runs on an
:class:`~batchserve.engines.runners.ExportedRunner`; the folder's text pipeline, the torch
engine's own (:class:`~batchserve.engines.heads.VectorHead`), tokenizes the texts and pools
the token embeddings in numpy: one code for every engine, so every pooling mode (left
padding and ``include_prompt: false`` included) is the torch engine's, and the answers
agree with it and with ``SentenceTransformer.encode`` (fp32: cosine >= 0.9999 per text, a
tested property for every family and pooling of the suite's zoo, and a bound of the
quality gate, :mod:`batchserve.engines.gate`, which an engine named on purpose passes
before it is served).
"""

from __future__ import annotations

from pathlib import Path

from batchserve.engines.hardware import Engine
from batchserve.engines.heads import VectorHead
from batchserve.engines.model import EngineModel
from batchserve.engines.pipeline import TextPipeline
from batchserve.engines.runners import ExportedRunner
from batchserve.engines.runtime import Runtime, default_threads, default_workers, place_exported
from batchserve.errors import ConfigError

__all__ = ["on_exported", "open_exported"]


def open_exported(
    source: Path,
    model_file: Path,
    *,
    backend: str,
    threads: int | None = None,
    dtype: str | None = None,
    streams: int = 1,
) -> EngineModel:
    """``model_file`` (exported from the model folder ``source``) on the CPU, ungated.

    Args:
        source: the model folder (its tokenizer and settings).
        model_file: the exported file.
        backend: ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-int8``.
        threads: CPU threads per pass; None takes the default.
        dtype: the precision (``float32``, ``bfloat16`` for OpenVINO; ``int8`` for the
            int8 files); None is the backend's own (int8 or float32).
        streams: passes that may run at once (OpenVINO's streams).

    Raises:
        ConfigError: the folder's texts are rendered through a chat template (only the
            torch engine reproduces it), or its graph's width is not its pooling's.
        ImportError: the backend's package is missing.
    """
    if dtype is None:
        dtype = "int8" if backend.endswith("-int8") else "float32"
    threads = threads or default_threads()
    pipeline = TextPipeline.read(source)
    runner = ExportedRunner.open(
        model_file, backend=backend, threads=threads, dtype=dtype, streams=streams
    )
    model = EngineModel(runner, VectorHead(pipeline))
    probe = model(["probe"])  # the first pass compiles; its width checks the graph
    if probe.shape != (1, pipeline.dimension):
        raise ConfigError(
            f"{model_file} answers vectors of shape {probe.shape[1:]}, not the folder's "
            f"{pipeline.dimension}: export it again (remove {model_file.parent})"
        )
    return model


def on_exported(source: Path, runtime: Runtime, *, gated: bool = True) -> EngineModel:
    """Export ``source`` for ``runtime.backend`` if not cached, gate it, load it.

    Blocks while exporting (once per model and backend; see
    :func:`~batchserve.engines.export.ensure_exported`) and while its gate runs the
    first time (:func:`~batchserve.engines.gate.gate_named`; cached after): at float32
    the edge texts against sentence-transformers (seconds), at a reduced precision
    (int8, bfloat16) the whole quality gate. The figures are kept as its ``gate``.
    OpenVINO is compiled with one stream per worker the server runs.

    Args:
        source: the model folder.
        runtime: backend, precision, threads, cache folder.
        gated: run the gate (``auto`` gates the engines it may choose itself, so it
            loads them ungated).

    Raises:
        ConfigError: the device is not the CPU, the CPU cannot compute in the
            precision, the folder's texts are rendered through a chat template (only
            torch reproduces it), a float32 engine misses the per-text floor on one of
            the model's edge texts, or a reduced precision does not keep the meaning
            (the gate's mean cosine or nearest passage); the message gives the
            figures. A reduced precision that keeps the meaning but fails the
            index-shaped bounds (nearest neighbours, batch invariance: dynamic int8)
            is served as asked, with a warning that says what it costs.
        ImportError: the backend's extra is missing.
    """
    from batchserve.engines.export import ensure_exported
    from batchserve.engines.gate import gate_named

    dtype = place_exported(runtime)
    threads = runtime.threads or default_threads()
    workers = default_workers("cpu", threads)
    if TextPipeline.read(source).renders_messages:
        raise ConfigError(
            f"backend {runtime.backend}: sentence-transformers renders {Path(source).name}'s "
            "texts through its chat template, which only the torch engine reproduces; "
            "serve it with --backend torch"
        )
    exported = ensure_exported(Path(source), runtime.backend, runtime.cache_path())
    model = open_exported(
        Path(source),
        exported.model_file,
        backend=runtime.backend,
        threads=threads,
        dtype=dtype,
        streams=workers,
    )
    if gated:
        model.gate = gate_named(
            Path(source),
            Engine(runtime.backend, dtype),
            model,
            runtime.cache_path(),
            threads=threads,
            workers=workers,
        )
    return model
