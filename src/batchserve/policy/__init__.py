"""The pure batching policy: admission, queue order, batch formation, expiry, outcomes."""

from batchserve.policy.core import Batch, Entry, Policy, Step
from batchserve.policy.outcomes import REJECT_REASONS, Counters, PolicyStats

__all__ = ["REJECT_REASONS", "Batch", "Counters", "Entry", "Policy", "PolicyStats", "Step"]
