"""Classes of work and tenants: what a model's mixed traffic is configured with.

A request belongs to one **class of work** (``interactive``, ``bulk``...) and to one
**tenant** (an API key, a team). Classes are listed most urgent first; each has a ``weight``
(its share of every forward pass while other classes wait too), a ``queue_share`` (the part
of ``queue_size`` its items may hold: shares that add up to at most 1 reserve room for every
class, so a full bulk queue never refuses a query), a default deadline and its own max wait.
Tenants named here get their own ``weight`` when they share a class; any other tenant has
weight 1. Within a class, one tenant may hold at most ``tenant_share`` of the class's queue,
so one flood cannot refuse everyone else. A class may ``reserve`` workers: the other
classes' passes leave that many free for it, and its items go in passes of their own, so a
query never waits behind a bulk pass (the price: bulk work runs on the other workers only).

A request names its class by name or by level (1 = the first class, as Triton numbers
priorities; 0 = the default class). :meth:`ClassConfig.resolve` turns what the wire says into
a class, with an error that names the rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchserve.config import check_positive
from batchserve.errors import ConfigError
from batchserve.units import parse_duration

__all__ = ["ClassConfig", "Tenant", "WorkClass", "parse_class", "parse_tenant"]


def _check_name(field: str, name: object) -> str:
    if not isinstance(name, str) or not name or not name.isprintable() or "," in name:
        raise ConfigError(
            f"{field} must be a non-empty printable name without commas, got {name!r}"
        )
    return name


def _check_share(field: str, value: object) -> float:
    v = check_positive(field, value)
    if v > 1:
        raise ConfigError(f"{field} must be in (0, 1], got {value!r}")
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkClass:
    """One class of work.

    Attributes:
        name: how requests name it (``X-Priority: bulk``).
        weight: its share of each forward pass while other classes are queued too,
            relative to the other classes' weights (> 0).
        queue_share: the fraction of ``queue_size`` its queued items may take, in (0, 1].
        timeout_s: the deadline of its requests that state none (None: the model's).
        max_wait_s: how long its oldest item may wait for a batch to fill (None: the
            batcher's ``max_wait_s``).
        reserve: workers kept for it: passes without its items (or another reserving
            class's) never take the last ``reserve`` free workers, and its items go in
            passes of reserving classes only (0: none kept).
    """

    name: str
    weight: float = 1.0
    queue_share: float = 1.0
    timeout_s: float | None = None
    max_wait_s: float | None = None
    reserve: int = 0

    def __post_init__(self) -> None:
        _check_name("class name", self.name)
        check_positive(f"class {self.name} weight", self.weight)
        _check_share(f"class {self.name} queue_share", self.queue_share)
        if self.timeout_s is not None:
            check_positive(f"class {self.name} timeout_s", self.timeout_s)
        if self.max_wait_s is not None and (
            isinstance(self.max_wait_s, bool) or not self.max_wait_s >= 0
        ):
            raise ConfigError(f"class {self.name} max_wait_s must be >= 0, got {self.max_wait_s!r}")
        if isinstance(self.reserve, bool) or not isinstance(self.reserve, int) or self.reserve < 0:
            raise ConfigError(
                f"class {self.name} reserve must be a whole number of workers >= 0, "
                f"got {self.reserve!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Tenant:
    """A tenant named in the configuration.

    Attributes:
        name: the tenant (an API key's name, or what the tenant header says).
        weight: its share of a class's passes relative to the other tenants queued in that
            class (unnamed tenants have weight 1).
    """

    name: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        _check_name("tenant name", self.name)
        check_positive(f"tenant {self.name} weight", self.weight)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassConfig:
    """The classes of work and tenants of one model.

    Attributes:
        classes: the classes, most urgent first (at least one).
        default: the class of a request that names none (None: the last, least urgent).
        tenants: tenants with a weight of their own; the only ones metrics name.
        tenant_share: the fraction of a class's queue one tenant may hold, in (0, 1]
            (requests with no tenant are not bounded by it).
    """

    classes: tuple[WorkClass, ...]
    default: str | None = None
    tenants: tuple[Tenant, ...] = ()
    tenant_share: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.classes, tuple) or not self.classes:
            raise ConfigError(
                f"classes must be a non-empty tuple of WorkClass, got {self.classes!r}"
            )
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ConfigError(f"class names must be unique, got {names}")
        if self.default is not None and self.default not in names:
            raise ConfigError(f"default class must be one of {names}, got {self.default!r}")
        tenants = [t.name for t in self.tenants]
        if len(set(tenants)) != len(tenants):
            raise ConfigError(f"tenant names must be unique, got {tenants}")
        _check_share("tenant_share", self.tenant_share)

    @property
    def reserved(self) -> int:
        """Workers kept for the reserving classes, together."""
        return sum(c.reserve for c in self.classes)

    def check_workers(self, workers: int) -> None:
        """Refuse reserves that leave the other classes no worker.

        Raises:
            ConfigError: the reserves add up to ``workers`` or more while a class reserves
                none.
        """
        if self.reserved and self.reserved >= workers and any(not c.reserve for c in self.classes):
            named = ", ".join(f"{c.name} reserve={c.reserve}" for c in self.classes if c.reserve)
            raise ConfigError(
                f"class reserves ({named}) must leave a worker for the other classes: "
                f"workers is {workers}"
            )

    @property
    def names(self) -> tuple[str, ...]:
        """The class names, most urgent first."""
        return tuple(c.name for c in self.classes)

    @property
    def default_class(self) -> WorkClass:
        """The class of a request that names none."""
        name = self.default
        return self.classes[-1] if name is None else self.classes[self.names.index(name)]

    def resolve(self, priority: str | int | None) -> WorkClass:
        """The class a request names: a class name, a level (1 = first class) or nothing.

        Raises:
            ConfigError: an unknown name, or a level outside ``0..len(classes)`` (the
                message lists what is allowed).
        """
        if priority is None:
            return self.default_class
        if isinstance(priority, bool):
            raise ConfigError(f"priority must be a class name or a level, got {priority!r}")
        if isinstance(priority, int):
            level = priority
        else:
            text = priority.strip()
            for c in self.classes:
                if c.name == text:
                    return c
            if not text.isdigit():
                raise ConfigError(
                    f"priority must be one of {', '.join(self.names)} or a level 0-"
                    f"{len(self.classes)}, got {priority!r}"
                )
            level = int(text)
        if level == 0:
            return self.default_class
        if not 1 <= level <= len(self.classes):
            raise ConfigError(
                f"priority level must be 0 (default) to {len(self.classes)}, got {priority!r}"
            )
        return self.classes[level - 1]

    def tenant_label(self, tenant: str | None) -> str:
        """The tenant's name in metrics: a configured tenant's name, else ``""``."""
        for t in self.tenants:
            if t.name == tenant:
                return t.name
        return ""

    def class_cap(self, work_class: WorkClass, queue_size: int) -> int:
        """Items ``work_class`` may hold queued: its share of ``queue_size``, at least 1."""
        return max(1, math.floor(work_class.queue_share * queue_size))

    def tenant_cap(self, class_cap: int) -> int:
        """Items one tenant may hold queued in a class of ``class_cap`` items, at least 1."""
        return max(1, math.floor(self.tenant_share * class_cap))


def _fields(text: str, what: str, allowed: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    name, _, rest = text.strip().partition(":")
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in allowed:
            raise ConfigError(
                f"{what} {name.strip()!r}: each setting must be one of "
                f"{', '.join(k + '=...' for k in allowed)}, got {part!r}"
            )
        fields[key] = value.strip()
    return name.strip(), fields


def _number(what: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{what} must be a number, got {value!r}") from None


def parse_class(text: str) -> WorkClass:
    """A class from its command-line form (``NAME[:weight=W,...]``).

    The settings: ``weight``, ``share`` (the queue share), ``timeout`` and ``max_wait``
    (durations take a unit: ``100ms``, ``30s``), ``reserve`` (whole workers).

    Raises:
        ConfigError: a setting that is unknown or breaks its rule (named in the message).
    """
    name, f = _fields(text, "class", ("weight", "share", "timeout", "max_wait", "reserve"))
    kw: dict[str, float] = {}
    reserve = 0
    if "reserve" in f:
        try:
            reserve = int(f["reserve"])
        except ValueError:
            raise ConfigError(
                f"class {name} reserve must be a whole number of workers >= 0, got {f['reserve']!r}"
            ) from None
    if "weight" in f:
        kw["weight"] = _number(f"class {name} weight", f["weight"])
    if "share" in f:
        kw["queue_share"] = _number(f"class {name} share", f["share"])
    if "timeout" in f:
        kw["timeout_s"] = parse_duration(f["timeout"], name=f"class {name} timeout")
    if "max_wait" in f:
        kw["max_wait_s"] = parse_duration(f["max_wait"], name=f"class {name} max_wait")
    return WorkClass(name=name, reserve=reserve, **kw)


def parse_tenant(text: str) -> Tenant:
    """A tenant from its command-line form ``NAME[:weight=W]``.

    Raises:
        ConfigError: a setting that is unknown or breaks its rule.
    """
    name, f = _fields(text, "tenant", ("weight",))
    if "weight" in f:
        return Tenant(name=name, weight=_number(f"tenant {name} weight", f["weight"]))
    return Tenant(name=name)
