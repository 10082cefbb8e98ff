"""The config file of ``batchserve serve``: its schema, and the precedence of its layers.

Theory of operation: a setting can come from four places. Lowest first: the built-in
defaults (the fields' own, in :mod:`batchserve.server.settings`), the TOML file's
``[defaults]`` table, its ``[models.NAME]`` table, and ``serve``'s flags, first those for
every model (``--max-wait 2ms``) then those for one (``--max-wait embed=2ms``). The file's
top level holds the server-wide keys (``host``, ``port``, ``api_key``...), ``tenants`` and
``tenant_share``; each model table holds the per-model keys (batcher, deadline, classes of
work, and the runtime of ``minilm`` or a model folder, which become options of its SPEC).

:func:`read` parses the file; :func:`merge` lays the layers over each other, converts each
value to its kind (a duration from ``"2ms"``, a bool from ``on``) and names the key and the
layer of any bad one. It answers the settings' fields by name (:class:`Merged`);
:meth:`ServerSettings.from_toml <batchserve.server.settings.ServerSettings.from_toml>`
builds the frozen settings from them, so the rules between fields are checked in one place
whichever way the settings are made.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchserve.config import BatchConfig
from batchserve.engines.runtime import Runtime
from batchserve.errors import ConfigError
from batchserve.models.loader import (
    default_model_name,
    is_hub_id,
    runs_on_engine,
    split_runtime,
    with_runtime,
)
from batchserve.policy import ClassConfig, Tenant, WorkClass
from batchserve.policy.classes import parse_class, parse_tenant
from batchserve.units import parse_duration

__all__ = ["API_KEY_ENV", "Merged", "merge", "read"]

#: The environment variable the API key may come from (``serve``), or be sent with (``load``).
API_KEY_ENV = "BATCHSERVE_API_KEY"

#: What overrides the file: ``serve``'s flags by their argparse names (``host``, ``model``, a
#: per-model key to a list of ``[NAME=]VALUE``, ``classes``, ``tenants``...).
_Overrides = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Merged:
    """The file and the flags merged: the settings' fields by name, each of its right kind.

    :meth:`~batchserve.server.settings.ServerSettings.from_toml` builds the settings from
    them, which checks the rules between fields (ports in range, unique names...).

    Attributes:
        server: :class:`~batchserve.server.settings.ServerSettings`' fields that were set,
            but ``models`` and ``limits``.
        limits: :class:`~batchserve.server.settings.RequestLimits`' fields that were set.
        models: each served model's :class:`~batchserve.server.settings.ModelSettings`
            fields, in order (the first is the default model).
    """

    server: dict[str, Any]
    limits: dict[str, Any]
    models: tuple[dict[str, Any], ...]


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
    # The runtime of minilm, a model folder or a Hub id, and a Hub id's revision: options of
    # its SPEC (field None).
    "backend": ("str", None),
    "device": ("str", None),
    "dtype": ("str", None),
    "threads": ("int", None),
    "cache_dir": ("str", None),
    "trust_remote_code": ("bool", None),
    "revision": ("str", None),
    "cuda_graphs": ("bool", None),
    "pooling": ("str", None),
}
_RUNTIME = (
    "backend",
    "device",
    "dtype",
    "threads",
    "cache_dir",
    "trust_remote_code",
    "revision",
    "cuda_graphs",
    "pooling",
)
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
    "any_dimensions": "bool",
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


def read(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The config file at ``path`` as TOML tables (None or empty: no file, ``{}``).

    Only its top-level keys are checked here; :func:`merge` checks the rest.

    Raises:
        ConfigError: the file is not TOML, or has an unknown top-level key; the message
            names the file and the key.
        OSError: the file cannot be read.
    """
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


def merge(file: dict[str, Any], args: _Overrides, environ: Mapping[str, str] | None) -> Merged:
    """The settings' fields from the file (:func:`read`), ``serve``'s flags and ``environ``.

    Precedence, lowest first: built-in defaults, the file's ``[defaults]``, its
    ``[models.NAME]``, flags for every model, flags for one model (``NAME=VALUE``);
    ``--model`` replaces the file's models. The API key comes from ``environ``'s
    :data:`API_KEY_ENV` (None: ``os.environ``) when neither the file nor a flag sets it.

    Raises:
        ConfigError: a key is unknown, a value is of the wrong kind, or a flag names a
            model that is not served; the message names it and its source.
    """
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
        order = [(default_model_name("minilm"), "minilm")]

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
            {"name": name, "spec": spec, "batch": batch, "classes": classes_of.get(name), **extra}
        )

    limits: dict[str, Any] = {
        k: server.pop(k)
        for k in ("max_body_bytes", "max_inputs", "max_input_chars", "any_dimensions")
        if k in server
    }
    if "read_timeout" in server:
        limits["read_timeout_s"] = server.pop("read_timeout")
    if "drain_timeout" in server:
        server["drain_timeout_s"] = server.pop("drain_timeout")
    return Merged(server=server, limits=limits, models=tuple(models))


_CLASS_KEYS = ("classes", "default_class")
_CLASS_TABLE_KEYS = {"name", "weight", "share", "timeout", "max_wait", "reserve"}


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
    # Whether the model is minilm, a folder or a Hub id run by --backend auto.
    base, own = split_runtime(spec)
    if not runs_on_engine(base):
        return False
    return str(runtime.get("backend", own.get("backend", "auto"))) == "auto"


def _apply_runtime(name: str, spec: str, options: dict[str, Any], named: set[str]) -> str:
    # Runtime settings become SPEC options; validated here so a typo fails at start-up.
    if not options:
        return spec
    base = split_runtime(spec)[0]
    if not runs_on_engine(base):
        if named:
            raise ConfigError(
                f"model {name}: {', '.join(sorted(named))} apply to minilm, a model folder or "
                f"a Hub id, not {spec!r}"
            )
        return spec
    if "revision" in options and not is_hub_id(base):
        # A revision given for every model skips those not named by a Hub id.
        if "revision" in named:
            raise ConfigError(
                f"model {name}: revision applies to a model named by its Hub id (org/name), "
                f"not {spec!r}"
            )
        options = {k: v for k, v in options.items() if k != "revision"}
    Runtime(**{k: v for k, v in options.items() if k != "revision"})
    return with_runtime(spec, {k: _option(v) for k, v in options.items()})


def _option(value: Any) -> str:
    # A SPEC option's text: a bool as on/off.
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
