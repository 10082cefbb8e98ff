"""One runner per runtime: what runs one sub-pass of a model, whatever its kind.

A runner takes one sub-pass's features (numpy arrays, items x width, as a head's
tokenizing makes them and :class:`~batchserve.engines.passes.SubPasses` cuts them) and
answers the model's raw output for those items as float32 on the CPU: the transformer's
token embeddings for an embedding model (its head pools them), the logits for a sequence
classification model. It knows how the model runs (the runtime, the device, the precision,
the threads) and nothing of what the output means; a head
(:mod:`batchserve.engines.heads`) knows that, and :class:`~batchserve.engines.model.EngineModel`
composes the two.

* :class:`TorchRunner`: a torch module on its device, at its weights' precision or under
  ``torch.autocast``; on a CUDA device its sub-passes may be replayed as CUDA graphs
  (:meth:`TorchRunner.capture_graphs`, :mod:`batchserve.engines.cuda_graphs`).
* :class:`ExportedRunner`: an exported graph on the CPU, on ONNX Runtime
  (:func:`open_onnx`) or OpenVINO (:func:`open_openvino`).

Threads and streams: ONNX Runtime runs concurrent calls side by side on their callers'
threads. OpenVINO runs infer requests on its *streams*, so an embedding model is compiled
with one stream per worker the server runs
(:func:`~batchserve.engines.runtime.default_workers`) and ``threads`` threads each, rather
than with its ``LATENCY`` hint's single stream (more texts a second with two workers on
two cores). OpenVINO computes at the precision it is compiled for (its
``INFERENCE_PRECISION_HINT``): ``f32`` for ``float32``, ``bf16`` for ``bfloat16``; the int8
IR is left to OpenVINO's own choice for the layers it keeps in floating point.

Shapes: OpenVINO's CPU plugin compiles kernels for each input shape it meets and keeps them
in a cache (``CPU_RUNTIME_CACHE_CAPACITY`` entries, 5,000 by default): a new shape costs a few
milliseconds, and every shape met stays in memory, so a server meeting ever more ``(items,
width)`` pairs grows for hours. Its runner therefore carries a
:class:`~batchserve.subpasses.ShapeGrid` (:data:`~batchserve.subpasses.GRID`) its passes
are planned on (:class:`~batchserve.engines.passes.SubPasses`), and its cache has a ceiling
of its own (:data:`OV_CACHE_ENTRIES`): the shapes are few, met early and kept.
ONNX Runtime and torch run any shape with the same kernels; their ``grid`` is None.

Thread-safety: every runner may be called from several threads at once (torch and ONNX
Runtime release the GIL during a pass; OpenVINO gets one infer request per calling thread;
CUDA graphs take turns on the device).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from batchserve.engines.cuda_graphs import Check, GraphedPasses, Step, cuda_capture
from batchserve.engines.pipeline import MODEL_INPUTS
from batchserve.subpasses import GRID, ShapeGrid

__all__ = [
    "OV_CACHE_ENTRIES",
    "ExportedRunner",
    "Run",
    "Runner",
    "TorchRunner",
    "TorchStep",
    "can_capture",
    "open_onnx",
    "open_openvino",
]

#: An exported graph's pass: numpy feeds by input name in, its first output out.
Run = Callable[[dict[str, npt.NDArray[np.int64]]], npt.NDArray[Any]]
#: A torch model's eager step: (the model, its inputs on its device) -> the output tensor.
TorchStep = Callable[[Any, dict[str, Any]], Any]


class Runner(Protocol):
    """What a model on an engine asks of its runtime (see the module docstring).

    Attributes:
        backend: ``torch``, ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-int8``.
        device: where the passes run (``cpu``, ``cuda:N``, ``mps``).
        dtype: the precision (``float32``, ``float16``, ``bfloat16``, ``int8``, or
            ``bfloat16-mixed``/``float16-mixed`` under autocast).
        threads: CPU threads per pass.
        graphs: the sub-passes replayed as CUDA graphs; None where they run eagerly.
        grid: the sub-pass shapes its passes are planned on, where the runtime compiles
            per shape; None where any shape runs as well.
    """

    backend: str
    device: str
    dtype: str
    threads: int
    graphs: GraphedPasses | None
    grid: ShapeGrid | None

    def __call__(self, features: Mapping[str, Any]) -> npt.NDArray[np.float32]:
        """One sub-pass's raw output: one row per item, float32 on the CPU."""
        ...


class TorchRunner:
    """A torch model's sub-passes, eagerly or replayed as CUDA graphs.

    Args:
        model: the loaded model (on its device, in eval mode).
        step: runs the model on one sub-pass's inputs (on its device); returns its
            output tensor (token embeddings or logits).
        autocast: ``bfloat16`` or ``float16``: run each pass under ``torch.autocast`` at
            that precision (the weights stay as they are); None runs at the weights'.

    Attributes:
        model: the model the step runs (a test may stand another in).
    """

    backend = "torch"
    grid: ShapeGrid | None = None

    def __init__(self, model: Any, step: TorchStep, *, autocast: str | None = None) -> None:
        import torch

        self._torch = torch
        self.model = model
        self._step = step
        weights = next(model.parameters())
        self.device = str(weights.device)
        self.dtype = f"{autocast}-mixed" if autocast else str(weights.dtype).removeprefix("torch.")
        self._autocast = getattr(torch, autocast) if autocast else None
        self.threads = torch.get_num_threads()
        self.graphs: GraphedPasses | None = None

    def __call__(self, features: Mapping[str, Any]) -> npt.NDArray[np.float32]:
        """One sub-pass: replayed as its bucket's CUDA graph where there are graphs."""
        if self.graphs is not None:
            return self.graphs(features)
        return self.eager(features)

    def eager(self, features: Mapping[str, Any]) -> npt.NDArray[np.float32]:
        """One sub-pass run eagerly: its features (on the CPU) moved to the device here."""
        torch = self._torch
        device = self.model.device
        inputs = {
            name: torch.as_tensor(features[name]).to(device)
            for name in MODEL_INPUTS
            if name in features
        }
        with torch.inference_mode(), self._precision():
            out: npt.NDArray[np.float32] = self._step(self.model, inputs).float().cpu().numpy()
        return out

    def capture_graphs(
        self,
        step: Step,
        *,
        check: Check,
        shaped: Callable[[int, int], Mapping[str, Any]],
        window: int,
    ) -> None:
        """Replay the sub-passes as CUDA graphs, captured now for every bucket of ``window``.

        Only on a CUDA device at the weights' own precision (not under autocast);
        elsewhere the passes stay eager. A capture that fails its check turns the graphs
        off (:class:`~batchserve.engines.cuda_graphs.GraphedPasses`).

        Args:
            step: what a graph captures (static buffers in, the eager step's output out).
            check: whether a capture's rows agree with the eager ones.
            shaped: a sub-pass of ``(n, width)`` tokens, as the head's tokenizing makes it.
            window: the model's window in tokens.
        """
        if not self.device.startswith("cuda") or self._autocast is not None:
            return
        self.graphs = GraphedPasses(
            step,
            self.eager,
            device=self.model.device,
            check=check,
            capture=cuda_capture(self._torch.cuda.graph_pool_handle()),
        )
        self.graphs.warm(shaped, window)

    def _precision(self) -> Any:
        if self._autocast is None:
            return contextlib.nullcontext()
        return self._torch.autocast(self.model.device.type, dtype=self._autocast)


def can_capture(config: Any, *, left_padded: bool) -> bool:
    """Whether a model of this ``config`` may be captured as CUDA graphs.

    An encoder with SDPA attention, padded on the right: its mask can be handed 4-D
    (:func:`~batchserve.engines.cuda_graphs.mask_4d`), so transformers prepares none (its
    preparation reads the mask's values on the CPU).
    """
    return (
        config is not None
        and not left_padded
        and not getattr(config, "is_decoder", False)
        and getattr(config, "_attn_implementation", None) == "sdpa"
    )


class ExportedRunner:
    """An exported graph's sub-passes on the CPU (ONNX Runtime or OpenVINO).

    Args:
        run: runs the graph on one sub-pass's feeds.
        input_names: the graph's inputs (a subset of ``input_ids``, ``attention_mask``,
            ``token_type_ids``); one the features lack (token types) is fed zeros.
        backend: the backend's name, for reports.
        threads: CPU threads per pass, for reports.
        dtype: the precision it computes in, for reports.
    """

    device = "cpu"
    graphs: GraphedPasses | None = None

    def __init__(
        self, run: Run, input_names: list[str], *, backend: str, threads: int, dtype: str
    ) -> None:
        self._run = run
        self.input_names = tuple(input_names)
        self.backend = backend
        self.threads = threads
        self.dtype = dtype
        self.grid: ShapeGrid | None = GRID if backend.startswith("openvino") else None

    @classmethod
    def open(
        cls, model_file: Path, *, backend: str, threads: int, dtype: str, streams: int = 1
    ) -> ExportedRunner:
        """``model_file`` on ``backend`` (``onnx...`` or ``openvino...``), compiled now.

        Raises:
            ImportError: the backend's package is missing.
        """
        opener = open_openvino if backend.startswith("openvino") else open_onnx
        run, names = opener(model_file, threads, dtype, max(1, streams))
        return cls(run, names, backend=backend, threads=threads, dtype=dtype)

    def __call__(self, features: Mapping[str, Any]) -> npt.NDArray[np.float32]:
        """One sub-pass (its rows sliced and columns cut: copied contiguous for the runtime)."""
        feeds = {
            name: np.ascontiguousarray(
                features[name] if name in features else np.zeros_like(features["input_ids"]),
                dtype=np.int64,
            )
            for name in self.input_names
        }
        return np.asarray(self._run(feeds), dtype=np.float32)


def open_onnx(model_file: Path, threads: int, dtype: str, streams: int) -> tuple[Run, list[str]]:
    """An ONNX Runtime session of ``model_file`` on the CPU: its pass and its input names."""
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


#: OpenVINO's kernel cache, in entries (several a shape, one per kernel it needs): set here
#: rather than left to the runtime's default, as a ceiling of its own; the grid keeps the
#: shapes, and so the entries that matter, far fewer.
OV_CACHE_ENTRIES = 4096
#: OpenVINO's precision hint for each precision it is asked to compute in.
_OV_PRECISION = {"float32": "f32", "bfloat16": "bf16"}


def open_openvino(
    model_file: Path, threads: int, dtype: str, streams: int
) -> tuple[Run, list[str]]:
    """``model_file`` compiled by OpenVINO for the CPU: its pass and its input names."""
    from batchserve.engines import telemetry

    ov = telemetry.openvino()

    config: dict[str, Any] = {
        "INFERENCE_NUM_THREADS": threads * streams,
        "NUM_STREAMS": streams,
        "CPU_RUNTIME_CACHE_CAPACITY": OV_CACHE_ENTRIES,
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
