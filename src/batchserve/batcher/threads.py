"""The model's worker threads: where a sync model's forward passes run, off the event loop."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Threads"]

Job = TypeVar("Job")
Outcome = TypeVar("Outcome")


class Threads(Generic[Job, Outcome]):
    """The model's worker threads, fed by one queue.

    A job (a forward pass) goes to a thread with one put on a C-level queue and comes back
    with one loop callback (``done(job, outcome or exception)``): no concurrent future,
    executor lock or thread-count check per pass, as ``ThreadPoolExecutor.submit`` has. The
    threads are daemons: a model stuck in a pass cannot hold the process open after
    shutdown, which asks each thread to stop once its pass is over.
    """

    def __init__(
        self,
        n: int,
        loop: asyncio.AbstractEventLoop,
        run: Callable[[Job], Outcome],
        done: Callable[[Job, Outcome | BaseException], None],
    ) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._loop = loop
        self._run = run
        self._done = done
        self._n = n
        for i in range(n):
            name = f"batchserve-model_{i}"
            threading.Thread(target=self._serve, name=name, daemon=True).start()

    def submit(self, job: Job) -> None:
        """Run ``job`` on the next free thread."""
        self._jobs.put(job)

    def shutdown(self) -> None:
        """Ask every thread to stop after its current pass (does not wait)."""
        for _ in range(self._n):
            self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            outcome: Outcome | BaseException
            try:
                outcome = self._run(job)
            except BaseException as exc:
                outcome = exc
            try:
                self._loop.call_soon_threadsafe(self._done, job, outcome)
            except RuntimeError:
                return  # the loop is closed: nobody is left to answer
