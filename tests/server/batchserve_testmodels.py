"""Models for the server tests, importable by SPEC (``batchserve_testmodels:NAME``).

The end-to-end tests put this folder on PYTHONPATH of the server they start. A recording
model appends every input it computes to the file named by ``BATCHSERVE_TEST_RECORD``, so a
test can prove an input never reached the model.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from batchserve.config import CostEstimate


def vector(text: str, dim: int = 4) -> list[float]:
    """A deterministic vector of a text: the same text always gives the same vector."""
    h = sum((i + 1) * ord(c) for i, c in enumerate(text))
    return [float((h * (k + 3)) % 97) / 97.0 for k in range(dim)]


class Recorder:
    """An embedding model that records its inputs and sleeps ``BATCHSERVE_TEST_SLEEP`` s."""

    kind = "embedding"
    dimension = 4

    def __init__(self) -> None:
        self.path = os.environ.get("BATCHSERVE_TEST_RECORD")
        self.sleep_s = float(os.environ.get("BATCHSERVE_TEST_SLEEP", "0"))
        # A sleeping model states its cost, so the server does not warm it up by sleeping.
        self.initial_cost = (
            CostEstimate(fixed_s=self.sleep_s, per_item_s=0.0) if self.sleep_s else None
        )
        self.seen: list[str] = []
        self.batches: list[list[str]] = []
        self._lock = threading.Lock()

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        with self._lock:
            self.seen.extend(texts)
            self.batches.append(list(texts))
            if self.path:
                with open(self.path, "a") as f:
                    f.writelines(t + "\n" for t in texts)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return [vector(t) for t in texts]


class Gate(Recorder):
    """A recording embedding model whose passes wait until the test opens the gate.

    ``entered`` is set as soon as a pass starts; ``release()`` lets every pass through.
    """

    def __init__(self) -> None:
        super().__init__()
        self.open = threading.Event()
        self.entered = threading.Event()

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        self.entered.set()
        if not self.open.wait(10):
            raise TimeoutError("the test never opened the gate")
        if any(t == "poison" for t in texts):
            raise ValueError("poison")
        return super().__call__(texts)

    def release(self) -> None:
        self.open.set()


def poisoned(texts: Sequence[str]) -> list[list[float]]:
    """Raises for any batch holding the text ``poison``; vectors otherwise."""
    if "poison" in texts:
        raise ValueError("this model cannot embed 'poison'")
    return [vector(t) for t in texts]


def broken(texts: Sequence[str]) -> list[list[float]]:
    """Breaks the contract: one output too few."""
    return [vector(t) for t in texts][:-1]


def double(items: Sequence[Any]) -> list[Any]:
    """A generic model: each item (a numpy row) times two."""
    return [np.asarray(x) * 2 for x in items]


def upper(items: Sequence[Any]) -> list[bytes]:
    """A generic model over BYTES rows: each item upper-cased."""
    return [bytes(x).upper() for x in items]


class SlowToLoad(Recorder):
    """A model whose construction (its "load") takes ``BATCHSERVE_TEST_LOAD_S`` seconds."""

    def __init__(self) -> None:
        super().__init__()
        time.sleep(float(os.environ.get("BATCHSERVE_TEST_LOAD_S", "2")))
