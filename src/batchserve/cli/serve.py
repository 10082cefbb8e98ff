r"""``batchserve serve``: the HTTP server, from flags and an optional TOML config file.

Every batcher setting is a flag that takes ``VALUE`` (every model) or ``NAME=VALUE`` (the
model NAME only), and may be repeated::

    batchserve serve --model fast=synthetic:fixed=1ms --model minilm \
        --max-batch-size 32 --max-wait 2ms --max-wait fast=0ms --timeout 250ms

The same settings can come from ``--config FILE`` (TOML)::

    host = "127.0.0.1"
    port = 8000
    grpc_port = 8001          # KServe v2 over gRPC too (unset: HTTP only)
    ssl_certfile = "cert.pem" # TLS on both (unset: plain HTTP and gRPC); with...
    ssl_keyfile = "key.pem"   # ... its private key
    ssl_ca_certs = "ca.pem"   # require client certificates signed by these CAs (unset: none)
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
from typing import Any

from batchserve.server.settings import API_KEY_ENV, ServerSettings

__all__ = ["add_parser", "build_settings"]


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
        "--grpc-port",
        type=int,
        metavar="PORT",
        help="also serve KServe v2 over gRPC on this port (Triton's 8001; 0 picks a free one; "
        "default: no gRPC; needs the grpc extra)",
    )
    p.add_argument(
        "--ssl-certfile",
        metavar="FILE",
        help="serve HTTPS (and gRPC over TLS) with this PEM certificate chain",
    )
    p.add_argument("--ssl-keyfile", metavar="FILE", help="the certificate's PEM private key")
    p.add_argument(
        "--ssl-ca-certs",
        metavar="FILE",
        help="with TLS, require client certificates signed by a CA of this PEM file, on both "
        "transports (mutual TLS; default: no client certificate asked for)",
    )
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


def build_settings(
    args: argparse.Namespace, environ: dict[str, str] | None = None
) -> ServerSettings:
    """Merge built-in defaults, the config file and the flags into ServerSettings.

    Raises:
        ConfigError: a setting breaks a rule; the message names it and its source.
    """
    return ServerSettings.from_toml(args.config, overrides=vars(args), environ=environ)


def run(args: argparse.Namespace) -> int:
    """Build the settings and serve until SIGTERM."""
    from batchserve.server.run import serve

    settings = build_settings(args)
    return serve(settings, log_level=args.log_level)
