"""The Go seed's experiment, as data: its model's cost, its load and its table's rows.

The seed (``../shared/seeds/``) measured one synthetic model (8 ms per call + 0.25 ms per
item) under 600 requests/s for 1.5 s, with four batching configurations. These constants
and :func:`seed_scenarios` are that experiment; the in-process load
(:func:`batchserve.loadgen.inprocess.run_seed_demo`), the simulator
(:func:`batchserve.sim.seed.predict_seed_demo`) and ``batchserve demo`` all read them, so the
measured table and the predicted one are the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchserve.config import BatchConfig

__all__ = [
    "SEED_DURATION_S",
    "SEED_FIXED_S",
    "SEED_PER_ITEM_S",
    "SEED_QUEUE",
    "SEED_RATE",
    "SEED_TIMEOUT_S",
    "SeedRow",
    "seed_scenarios",
]

#: The seed's model: 8 ms per call + 0.25 ms per item.
SEED_FIXED_S = 0.008
SEED_PER_ITEM_S = 0.00025
SEED_RATE = 600.0
SEED_DURATION_S = 1.5
SEED_TIMEOUT_S = 0.25
SEED_QUEUE = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedRow:
    """One row of the demo: a name and the batcher's settings."""

    name: str
    config: BatchConfig


def seed_scenarios(*, queue_size: int = SEED_QUEUE) -> list[SeedRow]:
    """The seed's four configurations (with this engine's defaults), then the extras."""

    def cfg(b: int, wait_s: float, admission: bool = True) -> BatchConfig:
        return BatchConfig(
            max_batch_size=b, max_wait_s=wait_s, queue_size=queue_size, admission=admission
        )

    return [
        SeedRow(name="no batching (batch=1)", config=cfg(1, 0.0)),
        SeedRow(name="batch<=8,  wait 2 ms", config=cfg(8, 0.002)),
        SeedRow(name="batch<=32, wait 2 ms", config=cfg(32, 0.002)),
        SeedRow(name="batch<=32, wait 20 ms", config=cfg(32, 0.020)),
        SeedRow(name="batch=1, admission off", config=cfg(1, 0.0, admission=False)),
        SeedRow(name="batch<=32, 2 ms, adm. off", config=cfg(32, 0.002, admission=False)),
    ]
