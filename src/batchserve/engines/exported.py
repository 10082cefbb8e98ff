"""A sentence-transformers model exported to ONNX Runtime or OpenVINO, as a batch function.

Theory of operation: one call is one pass, as with
:class:`~batchserve.engines.embeddings.SentenceEmbedder`, and the answers agree with it and
with ``SentenceTransformer.encode`` (fp32: cosine >= 0.9999 per text, a tested property for
every family and pooling of the suite's zoo, and a bound of the quality gate). The texts
are tokenized by the folder's text pipeline, the torch engine's own
(:class:`~batchserve.engines.pipeline.TextPipeline`: the window, special tokens, padding
side, lower-casing and whitespace as the installed sentence-transformers reads them); the
pass runs as length-sorted sub-passes through the same runner as torch's
(:class:`~batchserve.engines.passes.SubPasses`, with this engine's own learned cost); the
exported graph runs the transformer alone (its output the token embeddings, see
:mod:`batchserve.engines.export`), and the pipeline pools them, applies any ``Dense`` and,
where the folder ends in it, ``Normalize``, in numpy: one code for every engine, so every
pooling mode (left padding and ``include_prompt: false`` included) is the torch engine's.

Threads and streams: one pass uses the runtime's ``threads`` (see
:func:`~batchserve.engines.runtime.default_threads`). ONNX Runtime runs concurrent calls
side by side on their callers' threads. OpenVINO runs infer requests on its *streams*,
so it is compiled with one stream per worker the server runs
(:func:`~batchserve.engines.runtime.default_workers`) and ``threads`` threads each, rather
than with its ``LATENCY`` hint's single stream: with two workers on two cores, two streams
ran 12.0-19.5 texts/s against one stream's 11.9-16.8 (three alternated rounds at batch
32, another process's tests beside them).

Precision: OpenVINO computes at the precision it is compiled for (its
``INFERENCE_PRECISION_HINT``): ``f32`` for ``float32``, ``bf16`` for ``bfloat16`` (where the
CPU has AVX-512 BF16 or AMX); the int8 IR is left to OpenVINO's own choice for the layers
it keeps in floating point.

Thread-safety: tokenization holds the pipeline's lock (the fast tokenizer keeps state);
ONNX Runtime's ``InferenceSession.run`` may be called from several threads at once, and
OpenVINO gets one infer request per calling thread. Both release the GIL during a pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.hardware import Engine
from batchserve.engines.passes import PassStatistics, SubPasses, prior
from batchserve.engines.pipeline import TextPipeline
from batchserve.engines.runtime import Runtime, default_threads, default_workers, place_exported
from batchserve.errors import ConfigError
from batchserve.models.token_counts import TokenCounts, estimate_tokens

__all__ = ["ExportedEmbedder"]

_Run = Callable[[dict[str, npt.NDArray[np.int64]]], npt.NDArray[Any]]


def _onnx_runner(
    model_file: Path, threads: int, dtype: str, streams: int
) -> tuple[_Run, list[str]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[Any]:
        out: npt.NDArray[Any] = session.run(None, feeds)[0]
        return out

    return run, names


#: OpenVINO's precision hint for each precision it is asked to compute in.
_OV_PRECISION = {"float32": "f32", "bfloat16": "bf16"}


def _openvino_runner(
    model_file: Path, threads: int, dtype: str, streams: int
) -> tuple[_Run, list[str]]:
    from batchserve.engines import telemetry

    ov = telemetry.openvino()

    config: dict[str, Any] = {
        "INFERENCE_NUM_THREADS": threads * streams,
        "NUM_STREAMS": streams,
    }
    if dtype in _OV_PRECISION:
        config["INFERENCE_PRECISION_HINT"] = _OV_PRECISION[dtype]
    compiled = ov.Core().compile_model(str(model_file), "CPU", config)
    names = [port.get_any_name() for port in compiled.inputs]
    local = threading.local()

    def run(feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[Any]:
        request = getattr(local, "request", None)
        if request is None:
            request = local.request = compiled.create_infer_request()
        result = request.infer(feeds)
        return np.array(result[compiled.outputs[0]], copy=True)

    return run, names


class ExportedEmbedder:
    """An exported embedding model as a batch function from texts to float32 vectors.

    Args:
        pipeline: the folder's text pipeline (tokenizing, pooling, ``Dense``, ``Normalize``).
        run: runs the transformer on one pass's ``input_ids``/``attention_mask``/
            ``token_type_ids`` arrays; returns its token embeddings.
        input_names: the graph's inputs (a subset of those three).
        backend: the backend's name, for reports.
        threads: CPU threads per pass, for reports.
        dtype: the precision it computes in, for reports.

    Calling it blocks for the pass: run it in a worker. It may be called from several
    threads at once.

    Attributes:
        dimension: a vector's length.
        max_seq_length: the window in tokens (longer texts are truncated).
        pooling: the folder's pooling (``mean``, ``cls``, ``lasttoken``...).
        normalized: whether its vectors are unit length (the folder ends in ``Normalize``).
        pipeline: the :class:`~batchserve.engines.pipeline.TextPipeline`.
        gate: the gate's figures, when :meth:`load` gated it (None otherwise).
        passes: its :class:`~batchserve.engines.passes.SubPasses` (the plan's bounds, the
            learned cost; :meth:`statistics` reads it).
    """

    kind = "embedding"
    device = "cpu"

    def __init__(
        self,
        pipeline: TextPipeline,
        run: _Run,
        *,
        input_names: Sequence[str],
        backend: str,
        threads: int,
        dtype: str = "float32",
    ) -> None:
        self.pipeline = pipeline
        self._run = run
        self._inputs = list(input_names)
        self._counts = TokenCounts()
        self.max_seq_length = pipeline.window
        self.dimension = pipeline.dimension
        self.pooling = pipeline.pooling
        self.normalized = pipeline.normalized
        self.backend = backend
        self.threads = threads
        self.dtype = dtype
        #: The gate's figures when it was loaded on purpose (None: not gated here).
        self.gate: dict[str, Any] | None = None
        #: The pass runner: sub-passes planned on this engine's learned cost.
        self.passes = SubPasses(prior("cpu", threads), left_padded=pipeline.padding_side == "left")

    @classmethod
    def open(
        cls,
        source: Path,
        model_file: Path,
        *,
        backend: str,
        threads: int | None = None,
        dtype: str | None = None,
        streams: int = 1,
    ) -> ExportedEmbedder:
        """Load ``model_file`` (exported from the model folder ``source``) on the CPU.

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
        opener = _openvino_runner if backend.startswith("openvino") else _onnx_runner
        run, names = opener(model_file, threads, dtype, max(1, streams))
        model = cls(pipeline, run, input_names=names, backend=backend, threads=threads, dtype=dtype)
        probe = model(["probe"])  # the first pass compiles; its width checks the graph
        if probe.shape != (1, pipeline.dimension):
            raise ConfigError(
                f"{model_file} answers vectors of shape {probe.shape[1:]}, not the folder's "
                f"{pipeline.dimension}: export it again (remove {model_file.parent})"
            )
        return model

    @classmethod
    def load(cls, source: Path, runtime: Runtime, *, gated: bool = True) -> ExportedEmbedder:
        """Export ``source`` for ``runtime.backend`` if not cached, gate it, load it.

        Blocks while exporting (once per model and backend; see
        :func:`~batchserve.engines.export.ensure_exported`) and while its gate runs the
        first time (:func:`~batchserve.engines.gate.gate_named`; cached after): at float32
        the edge texts against sentence-transformers (seconds), at a reduced precision
        (int8, bfloat16) the whole quality gate. The figures are kept as :attr:`gate`.

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
        model = cls.open(
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

    @property
    def tokenizer(self) -> Any:
        """The folder's tokenizer (the pipeline's)."""
        return self.pipeline.tokenizer

    def __call__(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed ``texts`` in one pass (length-sorted sub-passes); one row per text, in order.

        Raises:
            TypeError: an input is not a string.
        """
        vectors, _ = self.embed(texts)
        return vectors

    def embed(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.float32], list[int]]:
        """Embed ``texts`` in one pass (length-sorted sub-passes); also return token counts.

        Raises:
            TypeError: an input is not a string.
        """
        batch = list(texts)
        for i, text in enumerate(batch):
            if not isinstance(text, str):
                raise TypeError(f"input {i} must be a string, got {type(text).__name__}")
        if not batch:
            return np.zeros((0, self.dimension), dtype=np.float32), []
        features, counts = self.features(batch)
        vectors = self.passes.run(features, counts, self._forward)
        self._counts.remember(batch, counts)
        return vectors, counts

    def features(self, texts: Sequence[str]) -> tuple[dict[str, Any], list[int]]:
        """One pass's features, as the pipeline tokenizes it, and each text's tokens."""
        features, counts = self.pipeline.tokenize(texts)
        for name in self._inputs:
            if name not in features:  # a graph input the tokenizer does not make (token types)
                features[name] = np.zeros_like(features["input_ids"])
        return features, counts

    def _forward(self, features: dict[str, Any]) -> npt.NDArray[np.float32]:
        # One sub-pass (its rows sliced and columns cut: copied contiguous for the runtime);
        # the graph's token embeddings pooled by the pipeline.
        feeds = {n: np.ascontiguousarray(features[n]) for n in self._inputs}
        tokens = np.asarray(self._run(feeds), dtype=np.float32)
        return self.pipeline.pool(tokens, features)

    def statistics(self) -> PassStatistics:
        """What this engine's passes computed (sub-passes, tokens) and the cost it learned."""
        return self.passes.statistics()

    def token_estimate(self, text: str) -> int:
        """About how many tokens ``text`` takes in a pass, before it is tokenized (cheap)."""
        return estimate_tokens(text, self.max_seq_length)

    def untruncated_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text before truncation to the window (special tokens included)."""
        return self.pipeline.untruncated(texts)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them (special tokens included, truncated)."""
        return self._counts.get(texts, self.pipeline.count)
