"""Finding the inputs that make a batch fail, by splitting it in halves.

Theory of operation: a :class:`Bisector` is a sans-I/O plan. The driver asks it for the next
span of inputs to run (``next_span``), runs the model on that span, and reports the outputs
(``succeeded``) or the exception (``raised``). The first span is the whole batch. A span that
raises is split in two halves, each tried on its own, until the failing inputs stand alone;
each lone failing input gets a :class:`~batchserve.errors.ModelError` with the model's
exception chained. The extra calls are bounded by ``budget``: once spent, every input of a
span that raises fails with the error of that span. A span whose output has the wrong length
fails whole with :class:`~batchserve.errors.OutputMismatch`: it is a broken contract, not a
bad input, so it is not split.

The same plan drives sync models (in a worker thread, :func:`run_sync`) and async models
(on the loop, :func:`run_async`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchserve.errors import ModelError, OutputMismatch
from batchserve.models.base import AsyncBatchFn, Outputs, SyncBatchFn

__all__ = ["BisectResult", "Bisector", "run_async", "run_sync"]


class BisectResult:
    """Outputs of a batch, with the errors of the inputs that failed.

    Attributes:
        outputs: one slot per input, in order; ``None`` where the input failed.
        errors: input index -> the error that input gets.
        extra_calls: model calls made beyond the first.
    """

    __slots__ = ("errors", "extra_calls", "outputs")

    def __init__(self, n: int) -> None:
        self.outputs: list[Any] = [None] * n
        self.errors: dict[int, ModelError] = {}
        self.extra_calls = 0


class Bisector:
    """A plan of model calls that isolates failing inputs. See the module docstring.

    Args:
        n: number of inputs in the batch.
        budget: at most this many calls beyond the first; ``None`` means ``2 * n``.
    """

    def __init__(self, n: int, budget: int | None = None) -> None:
        self.result = BisectResult(n)
        self._budget = 2 * n if budget is None else budget
        self._todo: list[tuple[int, int]] = [(0, n)] if n else []
        self._calls = 0

    def next_span(self) -> tuple[int, int] | None:
        """The ``(start, stop)`` slice of inputs to run next, or None when done."""
        if not self._todo:
            return None
        if self._calls > 0:
            self.result.extra_calls += 1
        self._calls += 1
        return self._todo.pop()

    def succeeded(self, span: tuple[int, int], outputs: Outputs) -> None:
        """Report the model's outputs for ``span``."""
        start, stop = span
        if isinstance(outputs, str | bytes) or len(outputs) != stop - start:
            got = type(outputs).__name__ if isinstance(outputs, str | bytes) else len(outputs)
            err = OutputMismatch(
                f"model returned {got} outputs for {stop - start} inputs; "
                "a batch model must return one output per input, in order"
            )
            for i in range(start, stop):
                self.result.errors[i] = err
            return
        self.result.outputs[start:stop] = list(outputs)

    def raised(self, span: tuple[int, int], exc: Exception) -> None:
        """Report that the model raised ``exc`` for ``span``."""
        start, stop = span
        remaining = self._budget - self.result.extra_calls - len(self._todo)
        if stop - start > 1 and remaining >= 2:
            mid = (start + stop) // 2
            # Pushed so that the left half runs first.
            self._todo.append((mid, stop))
            self._todo.append((start, mid))
            return
        for i in range(start, stop):
            err = ModelError(f"model raised {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            self.result.errors[i] = err


def run_sync(model: SyncBatchFn, inputs: Sequence[Any], budget: int | None) -> BisectResult:
    """Run a sync model on ``inputs``, bisecting on failure. Blocks; call from a worker."""
    plan = Bisector(len(inputs), budget)
    while (span := plan.next_span()) is not None:
        try:
            out = model(inputs[span[0] : span[1]])
        except Exception as exc:
            plan.raised(span, exc)
        else:
            plan.succeeded(span, out)
    return plan.result


async def run_async(model: AsyncBatchFn, inputs: Sequence[Any], budget: int | None) -> BisectResult:
    """Run an async model on ``inputs``, bisecting on failure."""
    plan = Bisector(len(inputs), budget)
    while (span := plan.next_span()) is not None:
        try:
            out = await model(inputs[span[0] : span[1]])
        except Exception as exc:
            plan.raised(span, exc)
        else:
            plan.succeeded(span, out)
    return plan.result
