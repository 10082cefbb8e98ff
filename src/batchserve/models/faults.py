"""A fault-injecting model, for reliability tests and chaos drills of a deployment.

:class:`FaultyModel` is an embedding model with the synthetic cost shape (it sleeps
``fixed + n * per_item`` per pass and answers the synthetic model's vectors) whose faults are
chosen by environment variables, so that a server started as
``batchserve serve --model batchserve.models.faults:FaultyModel`` (the loader instantiates
the class with no arguments) can be made to misbehave from outside:

=============================  ===============================================================
variable                       effect
=============================  ===============================================================
``BATCHSERVE_FAULT_COST``      the synthetic options, e.g. ``fixed=8ms,per_item=0.25ms,dim=8``
                               (default ``fixed=1ms,per_item=0.1ms,dim=8``)
``BATCHSERVE_FAULT_POISON``    a text; a pass that holds it raises ``ValueError``
``BATCHSERVE_FAULT_CRASH_RATE`` a fraction in [0, 1] of inputs that crash the pass holding
                               them (``RuntimeError``); which inputs is decided by a seeded
                               hash of the text (:func:`crashes_on`), so a bad input stays bad
                               on retry, as inputs that crash real models do
``BATCHSERVE_FAULT_FLAKY_RATE`` a fraction in [0, 1] of passes that raise whatever they hold
                               (a transient fault: a retry of the same inputs may succeed)
``BATCHSERVE_FAULT_SEED``      the seed of both draws (default 0)
``BATCHSERVE_FAULT_STALL_FILE`` a path: while that file exists a pass that starts is stuck
                               until it is removed (or, if the file holds a duration such as
                               ``2s``, takes that much longer); switched at run time
``BATCHSERVE_FAULT_RECORD``    a path: each pass appends one JSON line, the list of inputs it
                               was handed, before it runs, so a test can prove what the model
                               saw and what it never saw
=============================  ===============================================================

The model states its cost (``initial_cost``), so the server skips its warm-up passes: a
model told to fail would otherwise fail while it loads. Passes may run in several worker
threads at once; recording is serialized by a lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from typing import cast

from batchserve.config import CostEstimate
from batchserve.errors import ConfigError
from batchserve.models.kinds import EMBEDDING
from batchserve.models.loader import parse_synthetic
from batchserve.models.synthetic import SyntheticModel
from batchserve.units import parse_duration

__all__ = ["ENV_PREFIX", "FaultyModel", "crashes_on"]

#: Every variable the model reads starts with this.
ENV_PREFIX = "BATCHSERVE_FAULT_"

#: The longest a stalled pass waits for its file to go away, so a forgotten file cannot hang
#: a test run forever.
MAX_STALL_S = 120.0
_POLL_S = 0.005


def crashes_on(text: str, rate: float, seed: int = 0) -> bool:
    """Whether ``text`` is one of the inputs that crash a :class:`FaultyModel`.

    The draw is a hash of the seed and the text, uniform in [0, 1), compared with ``rate``:
    about ``rate`` of distinct texts crash, and the same text always gives the same answer.
    """
    digest = hashlib.blake2b(f"{seed}\0{text}".encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") / 2.0**64 < rate


def _rate(env: Mapping[str, str], name: str) -> float:
    raw = env.get(ENV_PREFIX + name, "0")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{ENV_PREFIX}{name} must be a number in [0, 1], got {raw!r}")
    return value


class FaultyModel:
    """The synthetic embedding model with injected faults; see the module docstring.

    Args:
        env: where the settings are read (default: ``os.environ``).

    Raises:
        ConfigError: a setting is malformed; the message names the variable.
    """

    kind = EMBEDDING

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        cost = env.get(ENV_PREFIX + "COST", "fixed=1ms,per_item=0.1ms,dim=8")
        self._synthetic: SyntheticModel = parse_synthetic("synthetic:" + cost)
        if self._synthetic.dimension is None:
            raise ConfigError(f"{ENV_PREFIX}COST must not set dim=0, got {cost!r}")
        self.dimension: int = self._synthetic.dimension
        self.initial_cost = CostEstimate(
            fixed_s=self._synthetic.fixed_s, per_item_s=self._synthetic.per_item_s
        )
        self.poison = env.get(ENV_PREFIX + "POISON") or None
        self.crash_rate = _rate(env, "CRASH_RATE")
        self.flaky_rate = _rate(env, "FLAKY_RATE")
        raw_seed = env.get(ENV_PREFIX + "SEED", "0")
        try:
            self.seed = int(raw_seed)
        except ValueError:
            raise ConfigError(f"{ENV_PREFIX}SEED must be an integer, got {raw_seed!r}") from None
        self.stall_file = env.get(ENV_PREFIX + "STALL_FILE") or None
        self.record_file = env.get(ENV_PREFIX + "RECORD") or None
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()
        self.calls = 0

    def __call__(self, inputs: Sequence[str]) -> list[list[float]]:
        """Record, stall, fail or compute, in that order; one vector per input.

        Raises:
            ValueError: the pass holds the poison text.
            RuntimeError: the pass holds an input drawn to crash, or a flaky pass.
        """
        texts = [str(x) for x in inputs]
        with self._lock:
            self.calls += 1
            flaky = self.flaky_rate > 0 and self._random.random() < self.flaky_rate
            if self.record_file is not None:
                line = json.dumps(texts, ensure_ascii=True)
                with open(self.record_file, "a", encoding="utf-8") as f:
                    f.write(line + "\n")
        self._stall()
        if self.poison is not None and self.poison in texts:
            raise ValueError(f"this model cannot embed {self.poison!r}")
        if self.crash_rate > 0:
            bad = [t for t in texts if crashes_on(t, self.crash_rate, self.seed)]
            if bad:
                raise RuntimeError(f"the model crashed on {bad[0]!r}")
        if flaky:
            raise RuntimeError("the model failed (an injected transient fault)")
        return cast(list[list[float]], self._synthetic(texts))

    def _stall(self) -> None:
        path = self.stall_file
        if path is None:
            return
        try:
            with open(path, encoding="utf-8") as f:
                content = f.read().strip()
        except FileNotFoundError:
            return
        if content:
            time.sleep(min(MAX_STALL_S, parse_duration(content, name=path)))
            return
        give_up = time.monotonic() + MAX_STALL_S
        while os.path.exists(path) and time.monotonic() < give_up:
            time.sleep(_POLL_S)

    def __repr__(self) -> str:
        return (
            f"FaultyModel(cost={self.initial_cost}, poison={self.poison!r}, "
            f"crash_rate={self.crash_rate}, flaky_rate={self.flaky_rate}, seed={self.seed}, "
            f"stall_file={self.stall_file!r}, record_file={self.record_file!r})"
        )
