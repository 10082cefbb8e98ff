r"""``batchserve serve``: the HTTP server, from flags and an optional TOML config file.

Every batcher setting is a flag that takes ``VALUE`` (every model) or ``NAME=VALUE`` (the
model NAME only), and may be repeated::

    batchserve serve --model fast=synthetic:fixed=1ms --model minilm \
        --max-batch-size 32 --max-wait 2ms --max-wait fast=0ms --timeout 250ms

The same settings can come from ``--config FILE`` (TOML)::

    host = "127.0.0.1"
    port = 8000
    grpc_port = 8001          # KServe v2 over gRPC too (unset: HTTP only)
    grpc_max_calls = 1300     # gRPC calls in flight past which grpcio refuses (unset: derived)
    ssl_certfile = "cert.pem" # TLS on both (unset: plain HTTP and gRPC); with...
    ssl_keyfile = "key.pem"   # ... its private key
    ssl_ca_certs = "ca.pem"   # require client certificates signed by these CAs (unset: none)
    drain_timeout = "30s"
    max_body_bytes = 8388608
    max_inputs = 2048
    max_input_chars = 32768
    any_dimensions = false    # any prefix as dimensions, not only the declared ones
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
    backend = "auto"          # runtime keys: backend, device, dtype, threads, cache_dir,
                              # trust_remote_code; and revision (a Hub id's)

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

The runtime keys (``--backend``, ``--device``, ``--dtype``, ``--threads``, ``--cache-dir``,
``--trust-remote-code``) apply to ``minilm``, model folders and Hub ids (``org/name``), and
``--revision`` to Hub ids; they become options of the SPEC
(``minilm:backend=onnx-int8,threads=1``, ``BAAI/bge-small-en-v1.5:revision=main``, see
:mod:`batchserve.models.loader`). Given for every model they skip the others; given for one
model that takes none, they are an error.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from batchserve.cli._common import HelpFormatter, falls_back
from batchserve.config import BatchConfig
from batchserve.policy.classes import ClassConfig
from batchserve.server.settings import API_KEY_ENV, ModelSettings, ServerSettings
from batchserve.units import format_duration

#: A tenant's share of a class's queue when neither flag nor file sets it.
_TENANT_SHARE = next(f.default for f in fields(ClassConfig) if f.name == "tenant_share")

__all__ = ["add_parser", "build_settings"]


def add_parser(sub: Any) -> None:
    """Register the ``serve`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve models over HTTP and gRPC (OpenAI embeddings, KServe v2, /metrics)",
        description="Serve models over HTTP (and gRPC) with dynamic batching. Batcher flags "
        "take VALUE (every model) or NAME=VALUE (one model) and may be repeated.",
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    server = ServerSettings()
    limits = server.limits
    batch = BatchConfig()
    model = ModelSettings(name="m", spec="minilm")

    def on(value: bool) -> str:
        return "on" if value else "off"

    p.add_argument("--config", metavar="FILE", help="TOML config file (see below)")
    falls_back(p.add_argument("--host", help="address to bind"), server.host)
    falls_back(p.add_argument("--port", type=int, help="port (0 picks a free one)"), server.port)
    falls_back(
        p.add_argument(
            "--grpc-port",
            type=int,
            metavar="PORT",
            help="also serve KServe v2 over gRPC on this port (Triton's 8001; 0 picks a free "
            "one; needs the grpc extra, which scripts/serve installs: elsewhere "
            "pip install 'batchserve[grpc]')",
        ),
        "no gRPC",
    )
    p.add_argument(
        "--grpc-max-calls",
        type=int,
        metavar="N",
        help="gRPC calls in flight at once past which grpcio refuses a call itself "
        "(RESOURCE_EXHAUSTED before batchserve reads it: no reason, no retry delay, not counted) "
        "(default: every model's queue size + 2 x workers x max batch size, + 64)",
    )
    p.add_argument(
        "--ssl-certfile",
        metavar="FILE",
        help="serve HTTPS (and gRPC over TLS) with this PEM certificate chain",
    )
    p.add_argument("--ssl-keyfile", metavar="FILE", help="the certificate's PEM private key")
    falls_back(
        p.add_argument(
            "--ssl-ca-certs",
            metavar="FILE",
            help="with TLS, require client certificates signed by a CA of this PEM file, on "
            "both transports (mutual TLS)",
        ),
        "no client certificate asked for",
    )
    falls_back(
        p.add_argument(
            "--model",
            action="append",
            default=[],
            metavar="[NAME=]SPEC",
            help="a model to serve (repeatable): minilm, synthetic[:fixed=8ms,per_item=0.25ms], "
            "a sentence-transformers folder, a Hugging Face Hub id (org/name), or "
            "package.module:attr",
        ),
        ", ".join(f"{m.name}={m.spec}" for m in server.models),
    )
    per_model: dict[str, tuple[str, object]] = {
        "max_batch_size": ("a batch closes at this many items", batch.max_batch_size),
        "max_wait": (
            "a batch closes when its oldest item waited this long",
            format_duration(batch.max_wait_s),
        ),
        "queue_size": ("items that may wait; one more is refused 429", batch.queue_size),
        "workers": (
            "forward passes at once",
            "minilm or a folder on the CPU, as many passes as the cores hold at --threads "
            f"each; otherwise {batch.workers}",
        ),
        "timeout": ("deadline of a request that states none", format_duration(model.timeout_s)),
        "admission": ("on/off: refuse at once what cannot meet its deadline", on(batch.admission)),
        "batch_by": (
            "count, tokens or auto: form passes by tokens, texts of similar length together",
            f"{batch.batch_by}: tokens for a model that counts them, such as minilm",
        ),
        "max_batch_tokens": (
            "by tokens: a pass holds at most this many padded tokens (longest x count)",
            "no bound but max-batch-size",
        ),
        "length_window": (
            "by tokens: a pass is chosen among the oldest N x max-batch-size queued items",
            batch.length_window,
        ),
        "prefetch": (
            "on/off: while the model is busy, hand it the next full batch at once, so it "
            "starts the moment the running pass ends",
            on(batch.prefetch),
        ),
        "backend": (
            "minilm/folder: auto, torch, onnx, onnx-int8, openvino, openvino-int8",
            "auto: on the first start on a machine every engine and precision it offers is "
            "measured at --max-batch-size and the fastest that passes the quality gate is "
            "served; the verdict is cached, so later starts are immediate",
        ),
        "device": ("minilm/folder: auto, cpu, cuda, cuda:N, mps", "auto: a GPU if any"),
        "dtype": (
            "minilm/folder: auto, float32, float16, bfloat16, float16-mixed, bfloat16-mixed "
            "(torch autocast), int8; half precision where the machine computes in it (a GPU; "
            "a CPU with AVX-512 BF16 or AMX)",
            "auto: float32, or what --backend auto measured",
        ),
        "threads": (
            "minilm/folder: CPU threads per pass",
            "cores - 1 up to 4 cores, cores - 2 above: a pass leaves the event loop a core",
        ),
        "cache_dir": (
            "minilm/folder: where ONNX/OpenVINO exports are cached",
            "$BATCHSERVE_CACHE_DIR or ~/.cache/batchserve",
        ),
        "cuda_graphs": (
            "minilm/folder on a CUDA GPU, torch: on/off: replay each pass shape as a CUDA "
            "graph (one launch instead of one a kernel), all captured at load; a model whose "
            "capture fails or differs from the eager pass runs eagerly, and the log says why",
            "off",
        ),
        "pooling": (
            "a bare ...ForMaskedLM folder: splade serves it as a SPLADE sparse embedder "
            "(POST /embed_sparse); a folder with modules.json states its own",
            "the folder's own; a masked-LM folder without it is refused",
        ),
        "revision": (
            "a model named by its Hub id (org/name): the branch, tag or commit to serve, "
            "from huggingface_hub's cache ($HF_HUB_CACHE), downloaded where the network "
            "allows (HF_HUB_OFFLINE=1: the cache only)",
            "main",
        ),
    }
    for key, (text, default) in per_model.items():
        action = p.add_argument(
            "--" + key.replace("_", "-"),
            action="append",
            default=[],
            metavar="[NAME=]VALUE",
            help=text,
        )
        falls_back(action, default)
    falls_back(
        p.add_argument(
            "--trust-remote-code",
            action="append",
            nargs="?",
            const="on",
            default=[],
            metavar="[NAME=]on",
            help="run the code a model folder ships (auto_map in its config.json), for every "
            "model or NAME's; without it such a folder is refused at start",
        ),
        "off",
    )
    falls_back(
        p.add_argument("--drain-timeout", help="SIGTERM: finish accepted work within"),
        format_duration(server.drain_timeout_s),
    )
    falls_back(
        p.add_argument("--max-body-bytes", type=int, help="request body limit"),
        f"{limits.max_body_bytes} (8 MiB)",
    )
    falls_back(
        p.add_argument("--max-inputs", type=int, help="inputs per request"), limits.max_inputs
    )
    falls_back(
        p.add_argument("--max-input-chars", type=int, help="characters per input"),
        limits.max_input_chars,
    )
    falls_back(
        p.add_argument(
            "--any-dimensions",
            action="store_const",
            const="on",
            help="accept any dimensions (a prefix of the vector, renormalised), not only "
            "those the model declares it was trained for (matryoshka_dimensions)",
        ),
        on(limits.any_dimensions),
    )
    falls_back(
        p.add_argument(
            "--read-timeout",
            help="a request's head, then its body, must arrive within this, else 408",
        ),
        format_duration(limits.read_timeout_s),
    )
    falls_back(
        p.add_argument(
            "--api-key", help="require 'Authorization: Bearer KEY' on inference endpoints"
        ),
        f"${API_KEY_ENV}, else none",
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
    falls_back(
        g.add_argument(
            "--default-class",
            action="append",
            default=[],
            metavar="[NAME=]CLASS",
            help="the class of requests that name none",
        ),
        "the last",
    )
    g.add_argument(
        "--tenant",
        dest="tenants",
        action="append",
        default=[],
        metavar="TENANT[:weight=W]",
        help="a tenant with a weight of its own (repeat); the only tenants metrics name",
    )
    falls_back(
        g.add_argument(
            "--tenant-share",
            help="the fraction of a class's queue one tenant may hold, in (0, 1]",
        ),
        f"{_TENANT_SHARE:g}",
    )
    falls_back(
        p.add_argument(
            "--otel",
            action="store_const",
            const="on",
            help="each request and forward pass becomes an OpenTelemetry span, exported over "
            "OTLP as OTEL_EXPORTER_OTLP_* say (pip install 'batchserve[otel]')",
        ),
        on(server.otel),
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
