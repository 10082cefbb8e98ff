"""The pure batching policy: admission, queue order, batch formation, expiry, outcomes.

One :class:`Policy`, composed of its queue's discipline (one FIFO queue, or ``classes`` of
work and tenants) and its passes' pricing (by count, or ``by_tokens``).
"""

from batchserve.policy.classes import ClassConfig, Tenant, WorkClass
from batchserve.policy.core import Actions, Batch, Entry, Policy, make_policy
from batchserve.policy.mixed import MixedEntry
from batchserve.policy.outcomes import REJECT_REASONS, Counters, PolicyStats, TokenStats

__all__ = [
    "REJECT_REASONS",
    "Actions",
    "Batch",
    "ClassConfig",
    "Counters",
    "Entry",
    "MixedEntry",
    "Policy",
    "PolicyStats",
    "Tenant",
    "TokenStats",
    "WorkClass",
    "make_policy",
]
