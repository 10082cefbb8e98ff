"""A copy of a model's tokenizer for the routes that tokenize outside a pass, behind a lock.

An engine's passes call its tokenizer under the engine's own lock, and a fast tokenizer must
not be called from two threads at once, nor copied while another thread sets its truncation
or padding (the copy reads the state the other call is changing: "Already borrowed"). The
routes that tokenize without a pass (TEI's ``/tokenize`` and ``/decode``, Cohere's
``truncate: START``, the windows of ``long_inputs``) share one copy per model, made when
the engine is loaded (:mod:`batchserve.engines.loader`, before any pass can run beside the
copying), and call it under :meth:`SpareTokenizer.held`, so they never wait on a pass
and never race one.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["SpareTokenizer"]


class SpareTokenizer:
    """One copy of a tokenizer, called by one thread at a time.

    Args:
        tokenizer: the engine's fast tokenizer, copied here (call this where no pass runs).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = copy.deepcopy(tokenizer)
        self._lock = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[Any]:
        """The copy, held for the block (other callers wait for it)."""
        with self._lock:
            yield self._tokenizer
