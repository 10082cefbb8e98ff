"""Model adapters: the batch-function protocol, the synthetic model, loaders."""

from batchserve.models.base import AsyncBatchFn, BatchFn, SyncBatchFn, is_async_model
from batchserve.models.synthetic import SyntheticModel

__all__ = ["AsyncBatchFn", "BatchFn", "SyncBatchFn", "SyntheticModel", "is_async_model"]
