"""The discrete-event simulator: the server's batching policy on virtual time.

:func:`simulate` drives the same :class:`~batchserve.policy.Policy` the server runs, on an
arrival schedule, with a cost model for each forward pass; :func:`simulate_backlog` is the
deterministic seed's experiment (a backlog served unbatched, then batched);
:func:`simulate_fleet` runs N replicas of the policy behind a router; :func:`simulate_mix`
runs mixed traffic (streams of several classes of work and tenants). All three run on one
event loop (:mod:`~batchserve.sim.loop`), each giving it its arrivals and answers.

Clients of the simulator live beside it: :mod:`~batchserve.sim.tuning` (the batching
settings with the most goodput within a p99 target), :mod:`~batchserve.sim.mixtune` (the
same for per-class targets), :mod:`~batchserve.sim.sizing` (the fewest replicas that meet
one) and :mod:`~batchserve.sim.seed` (the seed's table, predicted). They are imported from
their modules, not from here, as they import this package.
"""

from batchserve.sim.backlog import REQUIRED_GAIN, BacklogResult, BacklogRun, simulate_backlog
from batchserve.sim.engine import SimResult, TraceEvent, simulate
from batchserve.sim.fleet import ROUTINGS, FleetResult, ReplicaFigures, simulate_fleet
from batchserve.sim.mix import MixResult, Stream, StreamFigures, simulate_mix

__all__ = [
    "REQUIRED_GAIN",
    "ROUTINGS",
    "BacklogResult",
    "BacklogRun",
    "FleetResult",
    "MixResult",
    "ReplicaFigures",
    "SimResult",
    "Stream",
    "StreamFigures",
    "TraceEvent",
    "simulate",
    "simulate_backlog",
    "simulate_fleet",
    "simulate_mix",
]
