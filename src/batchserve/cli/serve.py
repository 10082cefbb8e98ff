r"""``batchserve serve``: the HTTP server, from flags and an optional TOML config file.

Every batcher setting is a flag that takes ``VALUE`` (every model) or ``NAME=VALUE`` (the
model NAME only), and may be repeated::

    batchserve serve --model fast=synthetic:fixed=1ms --model minilm \
        --max-batch-size 32 --max-wait 2ms --max-wait fast=0ms --timeout 250ms

The same settings can come from ``--config FILE`` (TOML)::

    host = "127.0.0.1"
    port = 8000
    drain_timeout = "30s"
    max_body_bytes = 8388608
    max_inputs = 2048
    max_input_chars = 32768
    read_timeout = "30s"

    [defaults]                # every model
    max_batch_size = 32
    max_wait = "2ms"
    queue_size = 1024
    workers = 1               # unset: the model's own (minilm on the CPU: cores // threads)
    timeout = "30s"
    admission = true
    batch_by = "auto"         # or "count", "tokens"
    length_window = 4
    prefetch = true

    [models.all-MiniLM-L6-v2] # one table per model, in serving order
    spec = "minilm"
    max_batch_size = 64
    max_batch_tokens = 4096
    backend = "auto"          # runtime keys: backend, device, dtype, threads, cache_dir

Precedence, lowest first: built-in defaults, the file's ``[defaults]``, the file's
``[models.NAME]``, flags for every model, flags for one model. When ``--model`` is given the
file's models are replaced by the flags' (their ``[models.NAME]`` settings still apply).
With no model anywhere, the built-in all-MiniLM-L6-v2 is served.

Classes of work (see the README's "Mixed traffic" section): ``--class [NAME=]CLASS:weight=W,
share=S,timeout=T,max_wait=T`` (repeated, most urgent first; NAME= for one model),
``--default-class [NAME=]CLASS``, ``--tenant TENANT:weight=W`` and ``--tenant-share F``; in the
file::

    tenant_share = 0.5        # one tenant may hold at most half of a class's queue

    [[tenants]]               # tenants with a weight, and a bearer key naming them
    name = "search"
    weight = 2
    key = "..."

    [models.all-MiniLM-L6-v2]
    default_class = "bulk"
    classes = [
        {name = "interactive", weight = 1, share = 0.25, timeout = "100ms"},
        "bulk:share=0.75,timeout=30s,max_wait=20ms",
    ]

The runtime keys (``--backend``, ``--device``, ``--dtype``, ``--threads``, ``--cache-dir``)
apply to ``minilm`` and model folders; they become options of the SPEC
(``minilm:backend=onnx-int8,threads=1``, see :mod:`batchserve.models.loader`). Given for
every model they skip the others; given for one model that takes none, they are an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tomllib
from typing import Any

from batchserve.config import BatchConfig
from batchserve.errors import ConfigError
from batchserve.models.loader import default_model_name, split_runtime, with_runtime
from batchserve.models.runtime import Runtime
from batchserve.policy import ClassConfig, Tenant, WorkClass
from batchserve.policy.classes import parse_class, parse_tenant
from batchserve.server.settings import (
    DEFAULT_MODEL_NAME,
    ModelSettings,
    RequestLimits,
    ServerSettings,
)
from batchserve.units import parse_duration

__all__ = ["add_parser", "build_settings"]

API_KEY_ENV = "BATCHSERVE_API_KEY"

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
    "drain_timeout": "duration",
    "max_body_bytes": "int",
    "max_inputs": "int",
    "max_input_chars": "int",
    "read_timeout": "duration",
    "api_key": "str",
    "otel": "bool",
}
_NAMED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)=(.*)$")


def add_parser(sub: Any) -> None:
    """Register the ``serve`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve models over HTTP (OpenAI embeddings, KServe v2, /metrics)",
        description="Serve models over HTTP with dynamic batching. Batcher flags take VALUE "
        "(every model) or NAME=VALUE (one model) and may be repeated.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file (see below)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000; 0 picks a free one)")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[NAME=]SPEC",
        help="a model to serve (repeatable): minilm, synthetic[:fixed=8ms,per_item=0.25ms], "
        "a sentence-transformers folder, or package.module:attr",
    )
    per_model = {
        "max_batch_size": "a batch closes at this many items (default 32)",
        "max_wait": "a batch closes when its oldest item waited this long (default 2ms)",
        "queue_size": "items that may wait; one more is refused 429 (default 1024)",
        "workers": "forward passes at once (default: minilm or a folder on the CPU, as many "
        "passes as the cores hold at --threads each; otherwise 1)",
        "timeout": "deadline of a request that states none (default 30s)",
        "admission": "on/off: refuse at once what cannot meet its deadline (default on)",
        "batch_by": "count, tokens or auto: form passes by tokens, texts of similar length "
        "together (default auto: tokens for a model that counts them, such as minilm)",
        "max_batch_tokens": "by tokens: a pass holds at most this many padded tokens "
        "(longest x count; default: no bound but max-batch-size)",
        "length_window": "by tokens: a pass is chosen among the oldest N x max-batch-size "
        "queued items (default 4)",
        "prefetch": "on/off: while the model is busy, hand it the next full batch at once, "
        "so it starts the moment the running pass ends (default on)",
        "backend": "minilm/folder: auto, torch, onnx, onnx-int8, openvino, openvino-int8 "
        "(default auto: on the first start on a machine every engine and precision it "
        "offers is measured at --max-batch-size and the fastest that passes the quality "
        "gate is served; the verdict is cached, so later starts are immediate)",
        "device": "minilm/folder: auto, cpu, cuda, cuda:N, mps (default auto: a GPU if any)",
        "dtype": "minilm/folder: auto, float32, float16, bfloat16, float16-mixed, "
        "bfloat16-mixed (torch autocast), int8; half precision where the machine computes "
        "in it (a GPU; a CPU with AVX-512 BF16 or AMX) (default auto: float32, or what "
        "--backend auto measured)",
        "threads": "minilm/folder: CPU threads per pass (default: cores - 1 up to 4 cores, "
        "cores - 2 above: a pass leaves the event loop a core)",
        "cache_dir": "minilm/folder: where ONNX/OpenVINO exports are cached "
        "(default $BATCHSERVE_CACHE_DIR or ~/.cache/batchserve)",
    }
    for key, text in per_model.items():
        p.add_argument(
            "--" + key.replace("_", "-"),
            action="append",
            default=[],
            metavar="[NAME=]VALUE",
            help=text,
        )
    p.add_argument("--drain-timeout", help="SIGTERM: finish accepted work within (default 30s)")
    p.add_argument("--max-body-bytes", type=int, help="request body limit (default 8 MiB)")
    p.add_argument("--max-inputs", type=int, help="inputs per request (default 2048)")
    p.add_argument("--max-input-chars", type=int, help="characters per input (default 32768)")
    p.add_argument(
        "--read-timeout",
        help="a request's head, then its body, must arrive within this, else 408 (default 30s)",
    )
    p.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' on inference endpoints (or ${API_KEY_ENV})",
    )
    g = p.add_argument_group(
        "classes of work and tenants (none: one FIFO queue per model)",
        "A request names its class with X-Priority (a name, or a level: 1 = the first class) "
        "or KServe's parameters.priority; its tenant is the name of its tenant key, or its "
        "X-Tenant header when no tenant keys are configured (keys: in the config file).",
    )
    g.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="[NAME=]CLASS[:weight=W,share=S,timeout=T,max_wait=T]",
        help="a class of work, most urgent first (repeat): its weight in every pass, its "
        "share of the queue, its default deadline and its max wait",
    )
    g.add_argument(
        "--default-class",
        action="append",
        default=[],
        metavar="[NAME=]CLASS",
        help="the class of requests that name none (default: the last)",
    )
    g.add_argument(
        "--tenant",
        dest="tenants",
        action="append",
        default=[],
        metavar="TENANT[:weight=W]",
        help="a tenant with a weight of its own (repeat); the only tenants metrics name",
    )
    g.add_argument(
        "--tenant-share",
        help="the fraction of a class's queue one tenant may hold, in (0, 1] (default 1)",
    )
    p.add_argument(
        "--otel",
        action="store_const",
        const="on",
        help="each request and forward pass becomes an OpenTelemetry span, exported over "
        "OTLP as OTEL_EXPORTER_OTLP_* say (pip install 'batchserve[otel]'; off by default)",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    p.set_defaults(run=run)


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


def build_settings(
    args: argparse.Namespace, environ: dict[str, str] | None = None
) -> ServerSettings:
    """Merge built-in defaults, the config file and the flags into ServerSettings.

    Raises:
        ConfigError: a setting breaks a rule; the message names it and its source.
    """
    environ = dict(os.environ) if environ is None else environ
    file: dict[str, Any] = {}
    if args.config:
        with open(args.config, "rb") as f:
            try:
                file = tomllib.load(f)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {args.config}: {exc}") from None
        _check_keys(
            file,
            set(_SERVER_KEYS) | {"defaults", "models", "tenants", "tenant_share"},
            f"config file {args.config}",
        )
    server: dict[str, Any] = {}
    for key, kind in _SERVER_KEYS.items():
        if key in file:
            server[key] = _convert(kind, key, file[key])
        flag = getattr(args, key, None)
        if flag is not None:
            server[key] = _convert(kind, "--" + key.replace("_", "-"), flag)
    if "api_key" not in server and environ.get(API_KEY_ENV):
        server["api_key"] = environ[API_KEY_ENV]

    defaults = file.get("defaults", {})
    _check_keys(defaults, set(_MODEL_KEYS) | set(_CLASS_KEYS), "[defaults]")
    file_models: dict[str, dict[str, Any]] = file.get("models", {})
    for name, table in file_models.items():
        _check_keys(table, set(_MODEL_KEYS) | set(_CLASS_KEYS) | {"spec"}, f"[models.{name}]")
    if args.model:
        order = [_split_model_flag(m) for m in args.model]
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
        for raw in getattr(args, key):
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
    args: argparse.Namespace,
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
    for flag, raws in (("--class", args.classes), ("--default-class", args.default_class)):
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
    if args.tenant_share is not None:
        try:
            share = float(args.tenant_share)
        except ValueError:
            raise ConfigError(
                f"--tenant-share must be a number, got {args.tenant_share!r}"
            ) from None
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


def _tenants(args: argparse.Namespace, file: dict[str, Any]) -> tuple[Tenant, ...]:
    tenants: dict[str, Tenant] = {}
    for i, table in enumerate(file.get("tenants", [])):
        if not isinstance(table, dict):
            raise ConfigError(f"tenants[{i}] must be a table, got {table!r}")
        _check_keys(table, {"name", "weight", "key"}, f"tenants[{i}]")
        if "name" not in table:
            raise ConfigError(f"tenants[{i}] needs name = '...'")
        weight = table.get("weight", 1.0)
        tenants[table["name"]] = Tenant(name=table["name"], weight=weight)
    for raw in args.tenants:
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


def run(args: argparse.Namespace) -> int:
    """Build the settings and serve until SIGTERM."""
    from batchserve.server.run import serve

    settings = build_settings(args)
    return serve(settings, log_level=args.log_level)
