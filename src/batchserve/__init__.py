"""batchserve: a Python model server built around dynamic batching.

The core API: a :class:`Batcher` in front of any function from a list of inputs to a list of
outputs, configured by a :class:`BatchConfig`; or the :func:`batched` decorator. Errors form
one tree rooted at :class:`BatchServeError` (see :mod:`batchserve.errors`).

The package, by layer, each importing only those before it (``tests/test_package.py``):

* vocabulary: ``errors``, ``clock``, ``units``, ``config``, ``costmodel``;
* core: ``policy``, ``batcher``, ``decorator``, ``bisection``, ``workload`` and ``models``
  (the model protocol, the synthetic and faulty models, the SPEC grammar);
* ``engines``: what runs a model that needs an engine (PyTorch, ONNX Runtime, OpenVINO)
  and picks the fastest one that keeps its quality;
* drivers: ``server``, ``sim``; outer: ``loadgen``, ``integrations``, ``testing``; shell:
  ``cli``.

A new engine goes in ``engines/``; a new kind of model is its protocol in ``models/`` and
what runs it in ``engines/``.
"""

from batchserve.batcher import Batcher, BatchRecord, Served, Ticket
from batchserve.clock import Clock, ManualClock, MonotonicClock
from batchserve.config import BatchConfig, CostEstimate
from batchserve.costmodel import CostModel
from batchserve.decorator import BatchedFunction, batched
from batchserve.errors import (
    BatchServeError,
    ConfigError,
    DeadlineExceeded,
    DeadlineInfeasible,
    ModelError,
    NotReady,
    OutputMismatch,
    QueueFull,
    Rejected,
    ShuttingDown,
)
from batchserve.models.synthetic import SyntheticModel
from batchserve.policy import (
    ClassConfig,
    Counters,
    Policy,
    PolicyStats,
    Tenant,
    WorkClass,
)

__version__ = "0.1.0"

__all__ = [
    "BatchConfig",
    "BatchRecord",
    "BatchServeError",
    "BatchedFunction",
    "Batcher",
    "ClassConfig",
    "Clock",
    "ConfigError",
    "CostEstimate",
    "CostModel",
    "Counters",
    "DeadlineExceeded",
    "DeadlineInfeasible",
    "ManualClock",
    "ModelError",
    "MonotonicClock",
    "NotReady",
    "OutputMismatch",
    "Policy",
    "PolicyStats",
    "QueueFull",
    "Rejected",
    "Served",
    "ShuttingDown",
    "SyntheticModel",
    "Tenant",
    "Ticket",
    "WorkClass",
    "__version__",
    "batched",
]
