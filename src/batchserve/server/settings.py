"""The server's settings: frozen, keyword-only, validated value objects.

:class:`ServerSettings` holds what is server-wide (address, request limits, API key, drain
timeout) and one :class:`ModelSettings` per served model (its name, its SPEC, its own
:class:`~batchserve.config.BatchConfig` and default deadline). The Python API takes them
directly; :meth:`ServerSettings.from_toml` builds them from a TOML config file and the
overrides ``batchserve serve``'s flags give (the file's schema, its keys, their kinds and
the precedence of its layers, are :mod:`batchserve.server.config_file`'s).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from batchserve.config import BatchConfig, check_positive
from batchserve.errors import ConfigError
from batchserve.models.loader import default_model_name
from batchserve.policy import ClassConfig
from batchserve.server import config_file
from batchserve.server.config_file import API_KEY_ENV

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_MODEL_NAME",
    "ModelSettings",
    "RequestLimits",
    "ServerSettings",
]

#: The name the built-in embedding model is served under when none is given.
DEFAULT_MODEL_NAME = default_model_name("minilm")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _check_limit(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestLimits:
    """What one request may carry; a request over a limit gets 413 before anything runs.

    Attributes:
        max_body_bytes: bytes in the request body.
        max_inputs: inputs (texts, tensor rows) in one request.
        max_input_chars: characters in one input text.
        read_timeout_s: seconds in which a request's head must arrive (from the connection's
            opening, or its first byte on a kept-alive connection), and then its whole body
            (from the end of the head); 408 after that, and the connection is closed: a
            slow or stalled client holds nothing for long.
        any_dimensions: a ``dimensions`` may be any prefix of a vector, not only those
            its model declares it was trained for (``--any-dimensions``; see
            :mod:`batchserve.server.protocols.dimensions`).
    """

    max_body_bytes: int = 8 * 1024 * 1024
    max_inputs: int = 2048
    max_input_chars: int = 32_768
    read_timeout_s: float = 30.0
    any_dimensions: bool = False

    def __post_init__(self) -> None:
        _check_limit("max_body_bytes", self.max_body_bytes)
        _check_limit("max_inputs", self.max_inputs)
        _check_limit("max_input_chars", self.max_input_chars)
        check_positive("read_timeout_s", self.read_timeout_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSettings:
    """One served model.

    Attributes:
        name: the name clients ask for (OpenAI ``model``, KServe ``/v2/models/{name}``).
        spec: what to load (see :func:`batchserve.engines.loader.load_model`).
        batch: its batcher's settings.
        timeout_s: the deadline of a request that states none, in seconds.
        classes: its classes of work and tenants (None: one FIFO queue, and a request's
            ``X-Priority`` is not read).
        auto_workers: run as many passes at once as the loaded model says uses the machine
            (``LoadedModel.workers``: two one-thread passes for ``minilm`` on two cores)
            instead of ``batch.workers``, where the model says; what ``serve`` does when
            ``--workers`` is not set.
    """

    name: str
    spec: str
    batch: BatchConfig = field(default_factory=BatchConfig)
    timeout_s: float = 30.0
    classes: ClassConfig | None = None
    auto_workers: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(
                "model name must be letters, digits, '.', '_' or '-' (not first), "
                f"got {self.name!r}"
            )
        if not isinstance(self.spec, str) or not self.spec:
            raise ConfigError(f"model spec must be a non-empty string, got {self.spec!r}")
        if not isinstance(self.batch, BatchConfig):
            raise ConfigError(f"batch must be a BatchConfig, got {self.batch!r}")
        check_positive("timeout_s", self.timeout_s)
        if self.classes is not None and not isinstance(self.classes, ClassConfig):
            raise ConfigError(f"classes must be a ClassConfig, got {self.classes!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    """The whole server.

    Attributes:
        models: the served models; the first is the default (used when a request names none).
        host: the address to bind.
        port: the port to bind; 0 picks a free one (printed in the ready line).
        grpc_port: also serve KServe v2 over gRPC on this port of ``host`` (0: a free one,
            printed in the ready line); None: no gRPC (the ``grpc`` extra).
        grpc_max_calls: gRPC calls in flight at once past which grpcio itself refuses a
            call (``RESOURCE_EXHAUSTED``, before it is decoded, with no retry delay); None:
            the models' queues plus two full batches per worker plus 64 (see
            :func:`batchserve.server.transport.grpc.max_calls`).
        limits: request limits.
        ssl_certfile: serve HTTPS and gRPC over TLS with this PEM certificate (chain) ...
        ssl_keyfile: ... and this PEM private key; both or neither.
        ssl_ca_certs: with TLS, require every client (both transports) to present a
            certificate signed by one of this PEM file's certificate authorities (mutual
            TLS); None: clients need none.
        api_key: if set, inference endpoints need ``Authorization: Bearer <api_key>``.
        tenant_keys: (tenant, key) pairs: a request that carries one of these keys as its
            bearer token belongs to that tenant. With any, inference endpoints need a key
            (``api_key`` too is then accepted, for requests of no tenant); with none, a
            request's tenant is its ``X-Tenant`` header.
        drain_timeout_s: on SIGTERM, at most this long is spent finishing accepted work.
        otel: each request and each forward pass becomes an OpenTelemetry span (the
            ``otel`` extra; see :mod:`batchserve.server.ops.tracing`). Off costs nothing.
    """

    models: tuple[ModelSettings, ...] = (ModelSettings(name=DEFAULT_MODEL_NAME, spec="minilm"),)
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int | None = None
    grpc_max_calls: int | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_ca_certs: str | None = None
    limits: RequestLimits = field(default_factory=RequestLimits)
    api_key: str | None = None
    tenant_keys: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    drain_timeout_s: float = 30.0
    otel: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.otel, bool):
            raise ConfigError(f"otel must be a bool, got {self.otel!r}")
        if not self.models:
            raise ConfigError("models must name at least one model, got none")
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"model names must be unique, got {', '.join(dupes)} twice")
        for name, port in (("port", self.port), ("grpc_port", self.grpc_port)):
            if port is None and name == "grpc_port":
                continue
            if isinstance(port, bool) or not isinstance(port, int):
                raise ConfigError(f"{name} must be an integer, got {port!r}")
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be in 0..65535, got {port!r}")
        calls = self.grpc_max_calls
        if calls is not None and (
            isinstance(calls, bool) or not isinstance(calls, int) or calls < 1
        ):
            raise ConfigError(f"grpc_max_calls must be an integer >= 1, got {calls!r}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError(
                "ssl_certfile and ssl_keyfile go together, got "
                f"ssl_certfile={self.ssl_certfile!r} and ssl_keyfile={self.ssl_keyfile!r}"
            )
        if self.ssl_ca_certs is not None and self.ssl_certfile is None:
            raise ConfigError(
                "ssl_ca_certs needs ssl_certfile and ssl_keyfile (client certificates are a "
                f"part of TLS), got ssl_ca_certs={self.ssl_ca_certs!r} without them"
            )
        if self.api_key is not None and not self.api_key:
            raise ConfigError("api_key must be non-empty when given, got ''")
        keys = [k for _, k in self.tenant_keys]
        if any(not isinstance(k, str) or not k for k in keys) or len(set(keys)) != len(keys):
            raise ConfigError("tenant keys must be non-empty and unique")
        if self.api_key is not None and self.api_key in keys:
            raise ConfigError("a tenant's key must differ from api_key")
        check_positive("drain_timeout_s", self.drain_timeout_s)

    @classmethod
    def from_toml(
        cls,
        path: str | os.PathLike[str] | None,
        *,
        overrides: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ServerSettings:
        """The settings of a TOML config file (None: none), under ``overrides``.

        The file's schema is ``batchserve serve --help``'s. Precedence, lowest first:
        built-in defaults, the file's ``[defaults]``, its ``[models.NAME]``, overrides for
        every model, overrides for one model. ``overrides`` are ``serve``'s flags by their
        argparse names: server keys (``host``, ``port``, ``drain_timeout``...) to a value,
        ``model`` to a list of ``[NAME=]SPEC`` (replacing the file's models), each per-model
        key (``max_batch_size``, ``max_wait``...) to a list of ``VALUE`` or ``NAME=VALUE``,
        and ``classes``, ``default_class``, ``tenants``, ``tenant_share``. The API key comes
        from ``environ``'s ``BATCHSERVE_API_KEY`` when neither sets it.

        Raises:
            ConfigError: a setting breaks a rule; the message names it and its source.
        """
        merged = config_file.merge(config_file.read(path), overrides or {}, environ)
        return cls(
            models=tuple(ModelSettings(**fields) for fields in merged.models),
            limits=RequestLimits(**merged.limits),
            **merged.server,
        )
