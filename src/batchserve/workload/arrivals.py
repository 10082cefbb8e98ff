"""Open-loop arrival schedules: when each request is sent, fixed before the run starts.

An open-loop load is paced by a schedule, never by answers, so a stalled server cannot slow
its own load down and hide its queue. The same schedule drives the in-process demo, the HTTP
load generator and the simulator, so their figures can be laid side by side. A schedule is a
sorted list of offsets in seconds from the start; it depends only on its arguments (a Poisson
schedule draws from its own seeded ``random.Random``, never the global random state).
"""

from __future__ import annotations

import random

__all__ = ["ARRIVAL_MODES", "arrival_times"]

#: The arrival processes :func:`arrival_times` knows.
ARRIVAL_MODES = ("constant", "poisson")


def arrival_times(
    *, rate: float, duration_s: float, arrivals: str = "constant", seed: int = 0
) -> list[float]:
    """Send offsets in seconds from the start, fixed in advance.

    Args:
        rate: requests per second.
        duration_s: the schedule's length; ``constant`` sends ``round(rate * duration_s)``
            requests evenly spaced from 0 (as the Go seed counts them), ``poisson`` every
            arrival before ``duration_s``.
        arrivals: ``constant`` (evenly spaced, as the seed) or ``poisson``.
        seed: the random seed for ``poisson``; the same seed gives the same schedule.

    Raises:
        ValueError: an unknown ``arrivals`` mode or a non-positive rate.
    """
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate!r}")
    if arrivals == "constant":
        return [i / rate for i in range(round(rate * duration_s))]
    if arrivals == "poisson":
        rng = random.Random(seed)
        out: list[float] = []
        t = rng.expovariate(rate)
        while t < duration_s:
            out.append(t)
            t += rng.expovariate(rate)
        return out
    raise ValueError(f"arrivals must be 'constant' or 'poisson', got {arrivals!r}")
