"""The pure batching policy: admission, queue order, batch formation, expiry, outcomes."""

from batchserve.policy.classes import ClassConfig, Tenant, WorkClass
from batchserve.policy.core import Actions, Batch, Entry, Policy
from batchserve.policy.mixed import MixedEntry, MixedPolicy
from batchserve.policy.outcomes import REJECT_REASONS, Counters, PolicyStats, TokenStats
from batchserve.policy.tokens import TokenPolicy, make_policy

__all__ = [
    "REJECT_REASONS",
    "Actions",
    "Batch",
    "ClassConfig",
    "Counters",
    "Entry",
    "MixedEntry",
    "MixedPolicy",
    "Policy",
    "PolicyStats",
    "Tenant",
    "TokenPolicy",
    "TokenStats",
    "WorkClass",
    "make_policy",
]
