"""A sentence-transformers model exported to ONNX Runtime or OpenVINO, as a batch function.

Theory of operation: one call is one pass, as with
:class:`~batchserve.engines.embeddings.SentenceEmbedder`, and the answers agree with it
(fp32: cosine >= 0.9999, a tested property). The texts are tokenized exactly as
sentence-transformers does (the model folder's own tokenizer, whitespace stripped, padded
to the longest, truncated at ``max_seq_length``); the pass runs as length-sorted
sub-passes through the same runner as torch's
(:class:`~batchserve.engines.passes.SubPasses`, with this engine's own learned cost); the
exported graph runs the transformer, pooling and normalization of each (see
:mod:`batchserve.engines.export`), and the result is normalized again (a no-op for a graph
that ends in ``Normalize``).

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

Thread-safety: tokenization holds a lock (the fast tokenizer keeps state); ONNX Runtime's
``InferenceSession.run`` may be called from several threads at once, and OpenVINO gets one
infer request per calling thread. Both release the GIL during a pass.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.hardware import Engine
from batchserve.engines.passes import PassStatistics, SubPasses, prior
from batchserve.engines.runtime import Runtime, default_threads, default_workers, place_exported
from batchserve.errors import ConfigError
from batchserve.models.token_counts import TokenCounts, estimate_tokens

__all__ = ["ExportedEmbedder"]

_log = logging.getLogger(__name__)
_Run = Callable[[dict[str, npt.NDArray[np.int64]]], npt.NDArray[Any]]


def _st_config(source: Path) -> dict[str, Any]:
    path = source / "sentence_bert_config.json"
    if path.is_file():
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data
    return {}


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
        tokenizer: the model's Hugging Face fast tokenizer.
        run: runs one pass on ``input_ids``/``attention_mask``/``token_type_ids`` arrays.
        input_names: the graph's inputs (a subset of those three).
        max_seq_length: texts are truncated to this many tokens.
        dimension: the embedding's length.
        backend: the backend's name, for reports.
        threads: CPU threads per pass, for reports.
        lower_case: lower-case texts before tokenizing (the model's ``do_lower_case``).
        dtype: the precision it computes in, for reports.

    Calling it blocks for the pass: run it in a worker. It may be called from several
    threads at once.

    Attributes:
        passes: its :class:`~batchserve.engines.passes.SubPasses` (the plan's bounds, the
            learned cost; :meth:`statistics` reads it).
    """

    kind = "embedding"
    device = "cpu"

    def __init__(
        self,
        tokenizer: Any,
        run: _Run,
        *,
        input_names: Sequence[str],
        max_seq_length: int,
        dimension: int,
        backend: str,
        threads: int,
        lower_case: bool = False,
        dtype: str = "float32",
    ) -> None:
        self._tokenizer = tokenizer
        self._run = run
        self._inputs = list(input_names)
        self._lower = lower_case
        self._lock = threading.Lock()
        self._counts = TokenCounts()
        self.max_seq_length = max_seq_length
        self.dimension = dimension
        self.backend = backend
        self.threads = threads
        self.dtype = dtype
        #: The pass runner: sub-passes planned on this engine's learned cost.
        self.passes = SubPasses(
            prior("cpu", threads),
            left_padded=getattr(tokenizer, "padding_side", "right") == "left",
        )

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
            ImportError: the backend's package is missing.
        """
        if dtype is None:
            dtype = "int8" if backend.endswith("-int8") else "float32"
        from transformers import AutoTokenizer

        threads = threads or default_threads()
        config = _st_config(source)
        tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
        max_len = int(config.get("max_seq_length") or min(tokenizer.model_max_length, 512))
        opener = _openvino_runner if backend.startswith("openvino") else _onnx_runner
        run, names = opener(model_file, threads, dtype, max(1, streams))
        probe = run(_feeds(tokenizer, ["probe"], names, max_len)[0])
        return cls(
            tokenizer,
            run,
            input_names=names,
            max_seq_length=max_len,
            dimension=int(probe.shape[-1]),
            backend=backend,
            threads=threads,
            lower_case=bool(config.get("do_lower_case", False)),
            dtype=dtype,
        )

    @classmethod
    def load(cls, source: Path, runtime: Runtime, *, gated: bool = True) -> ExportedEmbedder:
        """Export ``source`` for ``runtime.backend`` if not cached, gate it, load it.

        Blocks while exporting (once per model and backend; see
        :func:`~batchserve.engines.export.ensure_exported`) and, for a reduced precision
        (int8, bfloat16), while its quality gate runs the first time
        (:func:`~batchserve.engines.gate.gate`; cached after).

        Args:
            source: the model folder.
            runtime: backend, precision, threads, cache folder.
            gated: run the quality gate on a reduced precision (``auto`` gates the
                engines it may choose itself, so it loads them ungated).

        Raises:
            ConfigError: the device is not the CPU, the CPU cannot compute in the
                precision, or a reduced precision does not keep the meaning (the gate's
                mean cosine or nearest passage; the message gives the figures). One that
                keeps it but fails the index-shaped bounds (nearest neighbours, batch
                invariance: dynamic int8) is served as asked, with a warning that says
                what it costs.
            ImportError: the backend's extra is missing.
        """
        from batchserve.engines.export import ensure_exported
        from batchserve.engines.gate import gate

        dtype = place_exported(runtime)
        threads = runtime.threads or default_threads()
        workers = default_workers("cpu", threads)
        exported = ensure_exported(Path(source), runtime.backend, runtime.cache_path())
        model = cls.open(
            Path(source),
            exported.model_file,
            backend=runtime.backend,
            threads=threads,
            dtype=dtype,
            streams=workers,
        )
        if gated and dtype != "float32":
            engine = Engine(runtime.backend, dtype)
            quality = gate(
                Path(source), engine, model, runtime.cache_path(), threads=threads, workers=workers
            )
            if not quality.servable:
                raise ConfigError(
                    f"backend {runtime.backend} at {dtype} failed the quality gate on the "
                    f"shipped text set ({'; '.join(quality.failures(index=False))}); use "
                    "float32 or --backend auto"
                )
            if not quality.passes:
                _log.warning(
                    "backend %s at %s is served as asked, but --backend auto would not "
                    "choose it: %s",
                    runtime.backend,
                    dtype,
                    "; ".join(quality.failures()),
                )
        return model

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
        if self._lower:
            batch = [t.lower() for t in batch]
        with self._lock:
            feeds, counts = _feeds(self._tokenizer, batch, self._inputs, self.max_seq_length)
        vectors = self.passes.run(feeds, counts, self._forward)
        self._counts.remember(list(texts), counts)
        return vectors, counts

    def _forward(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        # One sub-pass (its rows sliced and columns cut: copied contiguous for the runtime).
        out = np.asarray(
            self._run({k: np.ascontiguousarray(v) for k, v in feeds.items()}), dtype=np.float32
        )
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.ascontiguousarray(out / np.maximum(norms, 1e-12), dtype=np.float32)

    def statistics(self) -> PassStatistics:
        """What this engine's passes computed (sub-passes, tokens) and the cost it learned."""
        return self.passes.statistics()

    def token_estimate(self, text: str) -> int:
        """About how many tokens ``text`` takes in a pass, before it is tokenized (cheap)."""
        return estimate_tokens(text, self.max_seq_length)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them (special tokens included, truncated)."""
        return self._counts.get(texts, self._tokenize_counts)

    def _tokenize_counts(self, texts: list[str]) -> list[int]:
        if self._lower:
            texts = [t.lower() for t in texts]
        with self._lock:
            enc = self._tokenizer(
                [t.strip() for t in texts],
                add_special_tokens=True,
                truncation=True,
                max_length=self.max_seq_length,
            )
        return [len(ids) for ids in enc["input_ids"]]


def _feeds(
    tokenizer: Any, texts: list[str], names: Sequence[str], max_len: int
) -> tuple[dict[str, npt.NDArray[np.int64]], list[int]]:
    enc = tokenizer(
        [t.strip() for t in texts],
        padding=True,
        truncation="longest_first",
        max_length=max_len,
        return_tensors="np",
    )
    feeds = {n: np.asarray(enc[n], dtype=np.int64) for n in names if n in enc}
    for n in names:
        if n not in feeds:  # a graph input the tokenizer does not make (token types)
            feeds[n] = np.zeros_like(feeds["input_ids"])
    counts = [int(c) for c in enc["attention_mask"].sum(axis=1)]
    return feeds, counts
