"""What one load run sends: the target, the protocol, the inputs and the schedule.

:class:`LoadConfig` is a frozen, validated value object; every other module of the load
generator reads its settings from it. Durations are float seconds (``*_s``). The schedule
itself is not stored: it is computed from ``rate``, ``duration_s``, ``arrivals`` and ``seed``
by :func:`LoadConfig.schedule`, so the same config always yields the same send times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from batchserve.config import check_non_negative, check_positive
from batchserve.errors import ConfigError
from batchserve.workload.arrivals import ARRIVAL_MODES, arrival_times

__all__ = ["APIS", "DEFAULT_MODEL", "SCHEMES", "LoadConfig", "Target"]

#: The protocols the generator speaks.
APIS = ("openai", "kserve", "rerank")
#: The URL schemes it sends over, with their default ports (``grpc``: KServe only).
SCHEMES = {"http": 80, "grpc": 8001}
#: The name ``batchserve serve`` gives its built-in model.
DEFAULT_MODEL = "all-MiniLM-L6-v2"

#: How long the client waits for an answer when no deadline is sent.
NO_DEADLINE_CLIENT_TIMEOUT_S = 30.0
#: How long past its deadline the client still waits for an answer before giving up.
DEFAULT_GRACE_S = 1.0


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where requests go, parsed from an ``http://host:port[/prefix]`` or ``grpc://`` URL.

    Attributes:
        scheme: ``http`` (HTTP/1.1) or ``grpc`` (KServe v2 over gRPC, in plain text).
        host: the host name or address.
        port: the TCP port (80 for ``http``, 8001 for ``grpc``, Triton's, when not given).
        prefix: a path prefix without a trailing slash ("" for none; ``grpc`` has none).
    """

    scheme: str = "http"
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Target:
        """Parse a base URL: plain ``http``, or ``grpc``.

        Raises:
            ConfigError: not an ``http://`` or ``grpc://`` URL with a host, it has a query
                or fragment, or a ``grpc://`` one has a path.
        """
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ConfigError(
                f"url must look like http://host:port or grpc://host:port, got {url!r}"
            )
        if parts.query or parts.fragment:
            raise ConfigError(f"url must not have a query or fragment, got {url!r}")
        if parts.scheme == "grpc" and parts.path.strip("/"):
            raise ConfigError(f"a grpc:// url must not have a path, got {url!r}")
        try:
            port = parts.port or SCHEMES[parts.scheme]
        except ValueError:
            raise ConfigError(f"url must have a valid port, got {url!r}") from None
        return cls(
            scheme=parts.scheme, host=parts.hostname, port=port, prefix=parts.path.rstrip("/")
        )

    @property
    def host_header(self) -> str:
        """The ``Host`` header's value."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 80 else f"{host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadConfig:
    """One open-loop run against one server.

    Attributes:
        url: the server's base URL, ``http://host:port`` (an optional path prefix is kept),
            or ``grpc://host:port`` for KServe's ``ModelInfer`` over gRPC
            (:mod:`~batchserve.loadgen.grpc_client`).
        api: ``openai`` (``POST /v1/embeddings``), ``kserve`` (``POST /v2/models/M/infer``,
            or ``ModelInfer`` with a ``grpc://`` url, which needs it) or ``rerank`` (TEI's
            ``POST /rerank``: one query and ``inputs_per_request`` passages, each a pair
            of the model's batcher).
        model: the model name sent in each request.
        texts: the input texts; request ``i`` takes the next ``inputs_per_request`` of them,
            cycling.
        inputs_per_request: inputs in each request (>= 1).
        timeout_s: each request's deadline, from its scheduled send time; None sends no
            deadline. It is sent as ``X-Request-Timeout`` (which the server counts from the
            request's arrival) and, with ``absolute_deadline``, as ``X-Request-Deadline``.
        absolute_deadline: also send the deadline as an absolute time (Unix epoch seconds:
            the scheduled send time plus ``timeout_s``), so that a request the generator
            wrote late, or the server read late, is judged from its schedule. Needs the
            server's clock to agree with this machine's (true of one machine).
        client_timeout_s: how long after its scheduled send time the client gives up on a
            request (counted as timed out). None means ``timeout_s + 1 s``, or 30 s without
            a deadline.
        rate: requests per second offered.
        duration_s: the schedule covers ``[0, duration_s)``.
        arrivals: ``constant`` (evenly spaced) or ``poisson``.
        seed: the seed of the Poisson schedule.
        processes: sender processes; the schedule is split round-robin among them.
        max_connections: a cap on open connections over all processes. A request never waits
            for a free connection below it (that would pace sends by answers); at the cap it
            does, and the report says how often.
        max_dials: a cap on connection attempts in progress, per process: a burst of them
            costs the server more than the requests they carry.
        warm_connections: connections each process opens before the start.
        kserve_input: the KServe input tensor's name.
        api_key: sent as ``Authorization: Bearer KEY`` when set (never printed).
        priority: the class of work each request names (``X-Priority``, and KServe's
            ``parameters.priority`` as Triton reads it when it is a level); None: none.
        tenant: sent as ``X-Tenant`` when set.
        name: the report row's label ("" for one made from the api and rate).
    """

    url: str
    api: str = "openai"
    model: str = DEFAULT_MODEL
    texts: tuple[str, ...] = field(default=("hello world",))
    inputs_per_request: int = 1
    timeout_s: float | None = None
    absolute_deadline: bool = True
    client_timeout_s: float | None = None
    rate: float = 100.0
    duration_s: float = 10.0
    arrivals: str = "constant"
    seed: int = 0
    processes: int = 1
    max_connections: int = 10_000
    max_dials: int = 32
    warm_connections: int = 32
    kserve_input: str = "text"
    api_key: str | None = field(default=None, repr=False)
    priority: str | None = None
    tenant: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        target = Target.parse(self.url)
        if self.api not in APIS:
            raise ConfigError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if target.scheme == "grpc" and self.api != "kserve":
            raise ConfigError(f"api must be kserve with a grpc:// url, got {self.api!r}")
        if self.arrivals not in ARRIVAL_MODES:
            raise ConfigError(
                f"arrivals must be one of {', '.join(ARRIVAL_MODES)}, got {self.arrivals!r}"
            )
        if not self.model:
            raise ConfigError("model must be a non-empty name, got ''")
        if not self.texts or not all(isinstance(t, str) for t in self.texts):
            raise ConfigError(f"texts must be a non-empty tuple of str, got {self.texts!r:.80}")
        _check_int("inputs_per_request", self.inputs_per_request, 1)
        if self.timeout_s is not None:
            check_positive("timeout_s", self.timeout_s)
        if self.client_timeout_s is not None:
            check_positive("client_timeout_s", self.client_timeout_s)
        check_positive("rate", self.rate)
        check_non_negative("duration_s", self.duration_s)
        _check_int("seed", self.seed, -(2**63))
        _check_int("processes", self.processes, 1)
        _check_int("max_connections", self.max_connections, self.processes)
        _check_int("max_dials", self.max_dials, 1)
        _check_int("warm_connections", self.warm_connections, 0)
        for what, value in (("priority", self.priority), ("tenant", self.tenant)):
            if value is not None and (not value or not value.isprintable() or "," in value):
                raise ConfigError(f"{what} must be a printable name without commas, got {value!r}")
        if not self.kserve_input:
            raise ConfigError("kserve_input must be a non-empty name, got ''")
        if math.isinf(self.rate * self.duration_s) or self.rate * self.duration_s > 1e8:
            raise ConfigError(
                f"rate * duration_s must be <= 1e8 requests, got {self.rate * self.duration_s:g}"
            )

    @property
    def target(self) -> Target:
        """The parsed URL."""
        return Target.parse(self.url)

    @property
    def give_up_s(self) -> float:
        """Seconds after its scheduled send time at which the client abandons a request."""
        if self.client_timeout_s is not None:
            return self.client_timeout_s
        if self.timeout_s is not None:
            return self.timeout_s + DEFAULT_GRACE_S
        return NO_DEADLINE_CLIENT_TIMEOUT_S

    @property
    def label(self) -> str:
        """The report row's label."""
        return self.name or f"{self.api} {self.rate:g}/s"

    def schedule(self) -> list[float]:
        """Send offsets in seconds from the start, sorted; the same config, the same list."""
        return arrival_times(
            rate=self.rate, duration_s=self.duration_s, arrivals=self.arrivals, seed=self.seed
        )
