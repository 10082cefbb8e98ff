"""Models as the core sees them: the batch-function protocol and the models that need no engine.

* :mod:`~batchserve.models.base`: the protocol, a function from a list of inputs to a list
  of outputs (sync or async); all the batcher knows of a model.
* :mod:`~batchserve.models.synthetic`, :mod:`~batchserve.models.faults`: the seed's cost
  model, and the same with faults to order, for tests, benchmarks and the simulator.
* :mod:`~batchserve.models.loader`: the SPEC grammar (``minilm:backend=onnx``,
  ``synthetic:fixed=8ms``, ``package.module:attr``), :class:`~batchserve.models.loader.LoadedModel`
  (what the protocols need to know of a model), and loading the SPECs that need no engine.
* :mod:`~batchserve.models.engine`: what the server may ask of a model that runs on an
  engine (its tokenizer, token counts, window, pooling, what its passes did).
* :mod:`~batchserve.models.token_counts`, :mod:`~batchserve.models.profiling`: tokens per
  text, and a model's measured cost per pass.

What runs a model on PyTorch, ONNX Runtime or OpenVINO, and picks which, is the layer above,
:mod:`batchserve.engines`; the core never imports it. A new kind of model starts here (its
protocol and its ``LoadedModel`` kind, with a synthetic stand-in) and runs in ``engines/``.
"""

from batchserve.models.base import AsyncBatchFn, BatchFn, SyncBatchFn, is_async_model
from batchserve.models.synthetic import SyntheticModel

__all__ = ["AsyncBatchFn", "BatchFn", "SyncBatchFn", "SyntheticModel", "is_async_model"]
