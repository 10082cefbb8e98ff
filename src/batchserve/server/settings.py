"""The server's settings: frozen, keyword-only, validated value objects.

:class:`ServerSettings` holds what is server-wide (address, request limits, API key, drain
timeout) and one :class:`ModelSettings` per served model (its name, its SPEC, its own
:class:`~batchserve.config.BatchConfig` and default deadline). The Python API takes them
directly; :meth:`ServerSettings.from_toml` builds them from a TOML config file and the
overrides ``batchserve serve``'s flags give (this module holds the file's schema: its keys,
their kinds, and the precedence of its layers).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from batchserve.config import BatchConfig, check_positive
from batchserve.engines.runtime import Runtime
from batchserve.errors import ConfigError
from batchserve.models.loader import default_model_name, split_runtime, with_runtime
from batchserve.policy import ClassConfig, Tenant, WorkClass
from batchserve.policy.classes import parse_class, parse_tenant
from batchserve.units import parse_duration

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
    """

    max_body_bytes: int = 8 * 1024 * 1024
    max_inputs: int = 2048
    max_input_chars: int = 32_768
    read_timeout_s: float = 30.0

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
        return _merge(_read_toml(path), overrides or {}, environ)


#: The environment variable the API key may come from (``serve``), or be sent with (``load``).
API_KEY_ENV = "BATCHSERVE_API_KEY"

#: What overrides the file: ``serve``'s flags by their argparse names (``host``, ``model``, a
#: per-model key to a list of ``[NAME=]VALUE``, ``classes``, ``tenants``...).
_Overrides = Mapping[str, Any]

# Per-model settings: flag/key -> (kind, BatchConfig field or None for the model's timeout).
_MODEL_KEYS: dict[str, tuple[str, str | None]] = {
    "max_batch_size": ("int", "max_batch_size"),
    "max_wait": ("duration", "max_wait_s"),
    "queue_size": ("int", "queue_size"),
    "workers": ("int", "workers"),
    "admission": ("bool", "admission"),
    "batch_by": ("str", "batch_by"),
    "max_batch_tokens": ("int", "max_batch_tokens"),
    "length_window": ("int", "length_window"),
    "prefetch": ("bool", "prefetch"),
    "timeout": ("duration", None),
    # The runtime of minilm or a model folder: options of its SPEC (field None).
    "backend": ("str", None),
    "device": ("str", None),
    "dtype": ("str", None),
    "threads": ("int", None),
    "cache_dir": ("str", None),
}
_RUNTIME = ("backend", "device", "dtype", "threads", "cache_dir")
_SERVER_KEYS = {
    "host": "str",
    "port": "int",
    "grpc_port": "int",
    "grpc_max_calls": "int",
    "ssl_certfile": "str",
    "ssl_keyfile": "str",
    "ssl_ca_certs": "str",
    "drain_timeout": "duration",
    "max_body_bytes": "int",
    "max_inputs": "int",
    "max_input_chars": "int",
    "read_timeout": "duration",
    "api_key": "str",
    "otel": "bool",
}
_NAMED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)=(.*)$")


def _convert(kind: str, name: str, value: Any) -> Any:
    if kind == "duration":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a duration such as '2ms', got {value!r}")
        return parse_duration(value, name=name)
    if kind == "int":
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"{name} must be an integer, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        return value
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("on", "true", "yes", "1"):
            return True
        if text in ("off", "false", "no", "0"):
            return False
        raise ConfigError(f"{name} must be on or off, got {value!r}")
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(allowed))}"
        )


def _split_model_flag(text: str) -> tuple[str, str]:
    match = _NAMED.match(text)
    if match and ":" not in match.group(1) and "/" not in match.group(1):
        return match.group(1), match.group(2)
    return default_model_name(text), text


def _read_toml(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    if not path:
        return {}
    with open(path, "rb") as f:
        try:
            file = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {os.fspath(path)}: {exc}") from None
    _check_keys(
        file,
        set(_SERVER_KEYS) | {"defaults", "models", "tenants", "tenant_share"},
        f"config file {os.fspath(path)}",
    )
    return file


def _merge(
    file: dict[str, Any], args: _Overrides, environ: Mapping[str, str] | None
) -> ServerSettings:
    environ = os.environ if environ is None else environ
    server: dict[str, Any] = {}
    for key, kind in _SERVER_KEYS.items():
        if key in file:
            server[key] = _convert(kind, key, file[key])
        flag = args.get(key)
        if flag is not None:
            server[key] = _convert(kind, "--" + key.replace("_", "-"), flag)
    if "api_key" not in server and environ.get(API_KEY_ENV):
        server["api_key"] = environ[API_KEY_ENV]

    defaults = file.get("defaults", {})
    _check_keys(defaults, set(_MODEL_KEYS) | set(_CLASS_KEYS), "[defaults]")
    file_models: dict[str, dict[str, Any]] = file.get("models", {})
    for name, table in file_models.items():
        _check_keys(table, set(_MODEL_KEYS) | set(_CLASS_KEYS) | {"spec"}, f"[models.{name}]")
    if args.get("model"):
        order = [_split_model_flag(m) for m in args["model"]]
    elif file_models:
        order = []
        for name, table in file_models.items():
            if "spec" not in table:
                raise ConfigError(f"[models.{name}] needs spec = '...'")
            order.append((name, str(table["spec"])))
    else:
        order = [(DEFAULT_MODEL_NAME, "minilm")]

    names = {name for name, _ in order}
    flags_all: dict[str, Any] = {}
    flags_one: dict[str, dict[str, Any]] = {}
    for key, (kind, _) in _MODEL_KEYS.items():
        for raw in args.get(key) or ():
            flag = "--" + key.replace("_", "-")
            match = _NAMED.match(raw)
            if match is None:
                flags_all[key] = _convert(kind, flag, raw)
            elif match.group(1) in names:
                flags_one.setdefault(match.group(1), {})[key] = _convert(
                    kind, f"{flag} {match.group(1)}", match.group(2)
                )
            else:
                raise ConfigError(
                    f"{flag} {raw!r}: no model named {match.group(1)!r}; "
                    f"served: {', '.join(sorted(names))}"
                )

    classes_of = _classes(args, file, defaults, file_models, names)
    server["tenant_keys"] = _tenant_keys(file)
    models = []
    for name, spec in order:
        merged: dict[str, Any] = {}
        for source, label in (
            (defaults, "[defaults]"),
            (file_models.get(name, {}), f"[models.{name}]"),
        ):
            for key, value in source.items():
                if key != "spec" and key not in _CLASS_KEYS:
                    merged[key] = _convert(_MODEL_KEYS[key][0], f"{label} {key}", value)
        named = {k for k in (*file_models.get(name, {}), *flags_one.get(name, {})) if k in _RUNTIME}
        merged.update(flags_all)
        merged.update(flags_one.get(name, {}))
        runtime = {k: merged.pop(k) for k in _RUNTIME if k in merged}
        size = merged.get("max_batch_size", BatchConfig().max_batch_size)
        if size != BatchConfig().max_batch_size and size >= 1 and _measures(spec, runtime):
            # --backend auto measures the engines at the batch size they will serve.
            runtime["batch_size"] = size
        spec = _apply_runtime(name, spec, runtime, named)
        # A timeout nobody set keeps ModelSettings' own default; workers nobody set are the
        # model's own (two one-thread passes for minilm on two cores).
        extra = {"timeout_s": merged.pop("timeout")} if "timeout" in merged else {}
        extra["auto_workers"] = "workers" not in merged
        fields: dict[str, Any] = {str(_MODEL_KEYS[k][1]): v for k, v in merged.items()}
        batch = dataclasses.replace(BatchConfig(), **fields)
        models.append(
            ModelSettings(name=name, spec=spec, batch=batch, classes=classes_of.get(name), **extra)
        )

    limits = RequestLimits(
        **{
            k: server.pop(k)
            for k in ("max_body_bytes", "max_inputs", "max_input_chars")
            if k in server
        },
        **({"read_timeout_s": server.pop("read_timeout")} if "read_timeout" in server else {}),
    )
    if "drain_timeout" in server:
        server["drain_timeout_s"] = server.pop("drain_timeout")
    return ServerSettings(models=tuple(models), limits=limits, **server)


_CLASS_KEYS = ("classes", "default_class")
_CLASS_TABLE_KEYS = {"name", "weight", "share", "timeout", "max_wait"}


def _class_list(value: Any, where: str) -> tuple[WorkClass, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} classes must be a non-empty list, got {value!r}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(parse_class(item))
        elif isinstance(item, dict):
            _check_keys(item, _CLASS_TABLE_KEYS, f"{where} classes[{i}]")
            if "name" not in item:
                raise ConfigError(f"{where} classes[{i}] needs name = '...'")
            settings = []
            for key, v in item.items():
                if key != "name":
                    is_num = isinstance(v, int | float) and not isinstance(v, bool)
                    text = f"{v}s" if key in ("timeout", "max_wait") and is_num else str(v)
                    settings.append(f"{key}={text}")
            out.append(parse_class(f"{item['name']}:{','.join(settings)}"))
        else:
            raise ConfigError(f"{where} classes[{i}] must be a string or a table, got {item!r}")
    return tuple(out)


def _classes(
    args: _Overrides,
    file: dict[str, Any],
    defaults: dict[str, Any],
    file_models: dict[str, dict[str, Any]],
    names: set[str],
) -> dict[str, ClassConfig]:
    # Each model's classes: [defaults], then [models.NAME], then flags for every model,
    # then flags for one model; tenants and their share are the server's, for every model.
    lists: dict[str, tuple[WorkClass, ...]] = {}
    chosen: dict[str, str] = {}
    for name in names:
        for table, label in (
            (defaults, "[defaults]"),
            (file_models.get(name, {}), f"[models.{name}]"),
        ):
            if "classes" in table:
                lists[name] = _class_list(table["classes"], label)
            if "default_class" in table:
                chosen[name] = _convert("str", f"{label} default_class", table["default_class"])
    for flag, raws in (
        ("--class", args.get("classes") or ()),
        ("--default-class", args.get("default_class") or ()),
    ):
        every: list[str] = []
        one: dict[str, list[str]] = {}
        for raw in raws:
            match = _NAMED.match(raw)
            if match is None:
                every.append(raw)
            elif match.group(1) in names:
                one.setdefault(match.group(1), []).append(match.group(2))
            else:
                raise ConfigError(
                    f"{flag} {raw!r}: no model named {match.group(1)!r}; "
                    f"served: {', '.join(sorted(names))}"
                )
        for name in names:
            given = one.get(name) or every
            if not given:
                continue
            if flag == "--class":
                lists[name] = tuple(parse_class(t) for t in given)
            else:
                chosen[name] = given[-1]
    tenants = _tenants(args, file)
    share: Any = file.get("tenant_share", 1.0)
    given_share = args.get("tenant_share")
    if given_share is not None:
        try:
            share = float(given_share)
        except ValueError:
            raise ConfigError(f"--tenant-share must be a number, got {given_share!r}") from None
    if not lists:
        if chosen or tenants or share != 1.0:
            raise ConfigError("default classes, tenants and tenant_share need classes (--class)")
        return {}
    for name in chosen:
        if name not in lists:
            raise ConfigError(f"model {name}: a default class needs classes (--class)")
    return {
        name: ClassConfig(
            classes=classes, default=chosen.get(name), tenants=tenants, tenant_share=share
        )
        for name, classes in lists.items()
    }


def _tenants(args: _Overrides, file: dict[str, Any]) -> tuple[Tenant, ...]:
    tenants: dict[str, Tenant] = {}
    for i, table in enumerate(file.get("tenants", [])):
        if not isinstance(table, dict):
            raise ConfigError(f"tenants[{i}] must be a table, got {table!r}")
        _check_keys(table, {"name", "weight", "key"}, f"tenants[{i}]")
        if "name" not in table:
            raise ConfigError(f"tenants[{i}] needs name = '...'")
        weight = table.get("weight", 1.0)
        tenants[table["name"]] = Tenant(name=table["name"], weight=weight)
    for raw in args.get("tenants") or ():
        t = parse_tenant(raw)
        tenants[t.name] = t
    return tuple(tenants.values())


def _tenant_keys(file: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    keys = []
    for i, table in enumerate(file.get("tenants", [])):
        if isinstance(table, dict) and "key" in table:
            keys.append((str(table["name"]), _convert("str", f"tenants[{i}] key", table["key"])))
    return tuple(keys)


def _measures(spec: str, runtime: dict[str, Any]) -> bool:
    # Whether the model is minilm or a folder run by --backend auto.
    base, own = split_runtime(spec)
    if not (base == "minilm" or os.path.isdir(base)):
        return False
    return str(runtime.get("backend", own.get("backend", "auto"))) == "auto"


def _apply_runtime(name: str, spec: str, options: dict[str, Any], named: set[str]) -> str:
    # Runtime settings become SPEC options; validated here so a typo fails at start-up.
    if not options:
        return spec
    base = split_runtime(spec)[0]
    if not (base == "minilm" or os.path.isdir(base)):
        if named:
            raise ConfigError(
                f"model {name}: {', '.join(sorted(named))} apply to minilm or a model folder, "
                f"not {spec!r}"
            )
        return spec
    Runtime(**options)
    return with_runtime(spec, {k: str(v) for k, v in options.items()})
