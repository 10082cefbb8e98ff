"""The asyncio driver of the batching policy (see :mod:`~batchserve.batcher.engine`).

* :mod:`~batchserve.batcher.engine`: :class:`Batcher`, the policy driven on real time;
* :mod:`~batchserve.batcher.answers`: what it hands back (:class:`Served`,
  :class:`BatchRecord`) and to whom (:class:`Waiter`, :class:`Ticket`);
* :mod:`~batchserve.batcher.threads`: the worker threads a sync model's passes run on.
"""

from batchserve.batcher.answers import BatchRecord, Served, Ticket, Waiter
from batchserve.batcher.engine import Batcher

__all__ = ["BatchRecord", "Batcher", "Served", "Ticket", "Waiter"]
