"""A torch sub-pass on a GPU, replayed as a CUDA graph of its shape bucket.

Theory of operation
-------------------
On a GPU a small encoder's eager forward is bound by the CPU that issues it, not by the
GPU: each of its kernels costs the CPU microseconds to launch, a matrix product's set-up
(cuBLASLt) tens of them, and a MiniLM pass issues about a hundred. A CUDA graph records
the kernels of one pass once and replays them with one launch. Measured on an H200 by
``bench/gpu/diagnose.py`` (the figures: ``docs/results/gpu_diagnose.json``), a pass of 32
texts of 64 tokens ran several times faster replayed than eager, and half precision,
slower than float32 eagerly there, became the faster one.

A graph replays fixed shapes, so :class:`GraphedPasses`:

1. runs a sub-pass of ``n`` items padded to ``L`` tokens in the bucket ``(N, W)``: the
   smallest ``N`` of :data:`ITEM_BUCKETS` >= ``n`` and ``W`` of :data:`WIDTH_BUCKETS` >=
   ``L``. The rows and columns it adds are padding (mask 0: no real token attends to
   them, and positions run from the left, so each real item's output is the one the
   unpadded pass gives, to float rounding); an added row attends to its first token alone
   (never to nothing, which would be a NaN), and its output is dropped. A sub-pass larger
   than every bucket, or a model padded on the left, runs eagerly;
2. captures every bucket's graph when the engine loads (:meth:`GraphedPasses.warm`, on
   inputs of the bucket's shape), or at a bucket's first sub-pass if it was not: the
   inputs are copied into the bucket's static buffers, the step runs twice on a side
   stream (warm-up), then once under capture, into a memory pool the graphs share;
3. checks the capture: the graph's output for that first sub-pass against the eager
   forward's on the same items, every item (:func:`cosine_within` for vectors,
   :func:`logits_within` for a reranker's or classifier's logits). A capture that raises or
   differs turns the graphs off for the engine, logged with the reason, and the engine runs
   eagerly from then on: right before fast;
4. holds one lock from a replay's copy in to its copy out (a bucket has one set of static
   buffers, and graphs sharing a pool must not run at once); the workers' tokenizing runs
   beside it, and the eager runs of an engine with graphs hold the same lock (a capture
   must see no other work on the device). At most ``max_graphs`` are kept: past that the
   least recently replayed is dropped.

The ``step`` is what is captured: it takes the static buffers (``input_ids``,
``attention_mask`` as items x width, and ``token_type_ids`` when the tokenizer makes them)
and returns a tensor of one row per item: a vector or logits (items x k), or token
embeddings (items x width x hidden), of which a sub-pass gets its own items and columns.
It must not read a tensor's values on the CPU (a capture cannot): the model is handed its
mask already 4-D (:func:`mask_4d`), so transformers prepares none.

``capture`` is injectable: :func:`cuda_capture` on a GPU; a test hands one that runs the
step eagerly on the static buffers, so the buckets, the padding, the check and the
eviction are tested where no GPU is.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "ITEM_BUCKETS",
    "MAX_GRAPHS",
    "WIDTH_BUCKETS",
    "Capture",
    "GraphedPasses",
    "cosine_within",
    "cuda_capture",
    "logits_within",
    "mask_4d",
]

_log = logging.getLogger(__name__)

#: Items a graph's sub-pass holds (a sub-pass holds at most passes.MAX_ITEMS: 128).
ITEM_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
#: Tokens a graph's sub-pass is padded to. Coarse on purpose: served lazily on an H200 with
#: 176 finer buckets, a 3-second load captured 43 graphs, each under the lock the replays
#: need, and served fewer texts than eager passes did; 48 buckets are all captured when the
#: engine loads (:meth:`GraphedPasses.warm`), and the padding they add costs a GPU little.
WIDTH_BUCKETS = (16, 32, 64, 128, 256, 512)
#: Graphs kept at most (each holds its buffers; the pool is shared): every bucket.
MAX_GRAPHS = len(ITEM_BUCKETS) * len(WIDTH_BUCKETS)

#: The step captured: static buffers in, one row per item out (a tensor on the device).
Step = Callable[[dict[str, Any]], Any]
#: Captures ``step`` on the static buffers: returns (replay, the output tensor replay fills).
Capture = Callable[[Step, dict[str, Any]], tuple[Callable[[], None], Any]]
#: Compares a graph's rows with the eager ones: None when they agree, else what differs.
Check = Callable[[npt.NDArray[np.float32], npt.NDArray[np.float32]], str | None]


def cosine_within(bound: float) -> Check:
    """Vectors agree when each item's cosine is at least ``bound``."""

    def check(graphed: npt.NDArray[np.float32], eager: npt.NDArray[np.float32]) -> str | None:
        worst = _worst_cosine(graphed, eager)
        return None if worst >= bound else f"cosine {worst:.6f} < {bound}"  # NaN fails too

    return check


def logits_within(tolerance: float) -> Check:
    """Logits agree when no item's moves by more than ``tolerance``."""

    def check(graphed: npt.NDArray[np.float32], eager: npt.NDArray[np.float32]) -> str | None:
        diff = np.abs(graphed.astype(np.float64) - eager)
        worst = float(np.max(diff)) if diff.size else 0.0
        return None if worst <= tolerance else f"a logit moved by {worst:.6f} > {tolerance}"

    return check


def mask_4d(mask: Any) -> Any:
    """An items x width mask (1: a token) as the items x 1 x width x width booleans SDPA takes."""
    n, width = mask.shape
    return mask[:, None, None, :].bool().expand(n, 1, width, width)


def cuda_capture(pool: Any) -> Capture:
    """Capture on the current CUDA device, into ``pool`` (``torch.cuda.graph_pool_handle()``)."""
    import torch

    def capture(step: Step, static: dict[str, Any]) -> tuple[Callable[[], None], Any]:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):
                step(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with (
            torch.inference_mode(),
            torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"),
        ):
            out = step(static)
        return graph.replay, out

    return capture


@dataclass(slots=True)
class _Graph:
    static: dict[str, Any]
    replay: Callable[[], None]
    output: Any


def _bucket(value: int, buckets: Sequence[int]) -> int | None:
    i = bisect.bisect_left(buckets, value)
    return buckets[i] if i < len(buckets) else None


class GraphedPasses:
    """A torch engine's sub-passes on a GPU, replayed as CUDA graphs (see the module doc).

    Args:
        step: the pass to capture (static buffers in, one row per item out).
        eager: the engine's own forward of one sub-pass (features on the CPU, the step's
            output for those items out, as float32 on the CPU): what runs when no graph
            does, and what a capture is checked against.
        device: the torch device the buffers live on.
        check: whether a capture's rows agree with the eager ones (:func:`cosine_within`,
            :func:`logits_within`).
        capture: how a graph is captured (:func:`cuda_capture`, or a test's stand-in).
        item_buckets, width_buckets: the bucket sizes (ascending).
        max_graphs: graphs kept at most.

    Thread-safe: calls from several workers take turns on the device.
    """

    def __init__(
        self,
        step: Step,
        eager: Callable[[dict[str, Any]], npt.NDArray[np.float32]],
        *,
        device: Any,
        check: Check,
        capture: Capture,
        item_buckets: Sequence[int] = ITEM_BUCKETS,
        width_buckets: Sequence[int] = WIDTH_BUCKETS,
        max_graphs: int = MAX_GRAPHS,
    ) -> None:
        import torch

        self._torch = torch
        self._step = step
        self._eager = eager
        self._device = device
        self._check = check
        self._capture = capture
        self._items = tuple(item_buckets)
        self._widths = tuple(width_buckets)
        self._max = max_graphs
        self._graphs: OrderedDict[tuple[int, int], _Graph] = OrderedDict()
        self._lock = threading.Lock()
        #: Why the graphs are off (None while they are on).
        self.off_reason: str | None = None
        self.captured = 0
        self.replayed = 0
        self.eager_runs = 0

    def bucket(self, n: int, width: int) -> tuple[int, int] | None:
        """The bucket of a sub-pass of ``n`` items ``width`` tokens wide (None: none fits)."""
        items, tokens = _bucket(n, self._items), _bucket(width, self._widths)
        return None if items is None or tokens is None else (items, tokens)

    def __call__(self, features: Mapping[str, Any]) -> npt.NDArray[np.float32]:
        """One sub-pass (features on the CPU, items x width): its items' rows, float32."""
        n, width = features["attention_mask"].shape
        bucket = None if self.off_reason is not None else self.bucket(int(n), int(width))
        with self._lock:
            if bucket is None:
                self.eager_runs += 1
                return self._eager(dict(features))
            graph = self._graphs.get(bucket)
            if graph is None:
                return self._first(bucket, features)
            self._graphs.move_to_end(bucket)
            self._fill(graph.static, features)
            graph.replay()
            self.replayed += 1
            return self._rows(graph.output, int(n), int(width))

    def warm(self, inputs: Callable[[int, int], Mapping[str, Any]], window: int) -> int:
        """Capture now every bucket a pass of the engine's ``window`` may use; how many.

        ``inputs(n, width)`` makes a sub-pass of that shape (features on the CPU). Stops at
        the first capture that fails its check (the graphs are then off, and it says why).
        Blocks for the captures (tens of milliseconds each on an H200).
        """
        widest = _bucket(window, self._widths) or self._widths[-1]
        for width in self._widths:
            if width > widest:
                break
            for n in self._items:
                if self.off_reason is not None:
                    return self.captured
                if (n, width) not in self._graphs:
                    with self._lock:
                        self._first((n, width), inputs(n, width))
        return self.captured

    def statistics(self) -> dict[str, Any]:
        """Graphs held, captured, replays, eager sub-passes, and why they are off if so."""
        return {
            "graphs": len(self._graphs),
            "captured": self.captured,
            "replayed": self.replayed,
            "eager": self.eager_runs,
            "off": self.off_reason,
        }

    # -- under the lock ----------------------------------------------------------------------

    def _first(
        self, bucket: tuple[int, int], features: Mapping[str, Any]
    ) -> npt.NDArray[np.float32]:
        n, width = (int(x) for x in features["attention_mask"].shape)
        eager = self._eager(dict(features))
        self.eager_runs += 1
        static = {
            k: self._torch.zeros(bucket, dtype=self._torch.as_tensor(v).dtype, device=self._device)
            for k, v in features.items()
            if getattr(v, "shape", None) is not None
            and tuple(v.shape) == tuple(features["attention_mask"].shape)
        }
        try:
            self._fill(static, features)
            replay, output = self._capture(self._step, static)
            self._fill(static, features)
            replay()
            graphed = self._rows(output, n, width)
        except Exception as exc:  # a model whose pass cannot be captured runs eagerly
            self._turn_off(f"capturing a {bucket[0]} x {bucket[1]} pass failed: {exc!r:.300}")
            return eager
        differs = self._check(graphed, eager)
        if differs is not None:
            self._turn_off(
                f"a {bucket[0]} x {bucket[1]} pass replayed differs from the eager one: {differs}"
            )
            return eager
        self.captured += 1
        self._graphs[bucket] = _Graph(static=static, replay=replay, output=output)
        while len(self._graphs) > self._max:
            self._graphs.popitem(last=False)
        return eager

    def _fill(self, static: dict[str, Any], features: Mapping[str, Any]) -> None:
        torch = self._torch
        mask = features["attention_mask"]
        n, width = mask.shape
        rows, cols = static["attention_mask"].shape
        for name, buf in static.items():
            src = torch.as_tensor(features[name])
            padded = torch.zeros((rows, cols), dtype=buf.dtype)
            padded[:n, :width] = src
            if name == "attention_mask" and rows > n:
                padded[n:, 0] = 1  # an added row attends to its first token, never to none
            buf.copy_(padded)

    def _rows(self, output: Any, n: int, width: int) -> npt.NDArray[np.float32]:
        # The sub-pass's own items (and, for token embeddings, its own columns). A copy:
        # the graph's output buffer is rewritten by the next replay (off a GPU, .cpu()
        # would hand back the buffer itself).
        mine = output[:n, :width] if output.dim() == 3 else output[:n]
        out: npt.NDArray[np.float32] = np.array(mine.float().cpu().numpy(), copy=True)
        return out

    def _turn_off(self, reason: str) -> None:
        self.off_reason = reason
        self._graphs.clear()
        _log.warning("CUDA graphs are off for this engine, which runs eagerly: %s", reason)


def _worst_cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    # An item's row, whatever its shape (a vector, or its tokens' embeddings end to end).
    a64 = a.astype(np.float64).reshape(len(a), -1)
    b64 = b.astype(np.float64).reshape(len(b), -1)
    num = np.sum(a64 * b64, axis=1)
    den = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    same = den == 0  # two zero rows agree; one zero row does not
    cos = np.where(
        same, np.all(a64 == b64, axis=1).astype(np.float64), num / np.where(same, 1, den)
    )
    return float(np.min(cos)) if len(cos) else 1.0
