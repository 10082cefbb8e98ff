"""``batchserve profile``: measure a model's cost curve and write it as a JSON profile.

The model runs at batch sizes from 1 to ``--max-batch-size`` (``--repeats`` passes each, the
median kept), ``fixed + n * per_item`` is fitted by least squares, and the fit's quality is
shown. ``simulate``, ``tune`` and ``serve`` take the file with ``--profile FILE``.

With ``--backend`` (``all`` or a list), the built-in model (or a folder) is profiled on
each backend and compared with torch fp32 on the quality set: see
:mod:`batchserve.cli.profile_backends`. With ``--backends``, every engine the machine offers
is measured as ``serve --backend auto`` measures it, at ``--max-batch-size``; the table and
the choice are printed and cached, so the next ``serve`` starts at once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from batchserve.cli._common import HelpFormatter, positive_int
from batchserve.engines.loader import load_model
from batchserve.errors import ConfigError
from batchserve.models.loader import with_runtime
from batchserve.models.profiling import (
    Profile,
    default_sizes,
    profile_model,
    sample_inputs,
    save_profile,
)
from batchserve.units import format_duration

__all__ = ["add_parser"]


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated integers, got {text!r}"
        ) from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"sizes must be integers >= 1, got {text!r}")
    return sizes


def add_parser(sub: Any) -> None:
    """Register the ``profile`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "profile",
        help="measure a model's cost per pass and per item; write a JSON profile",
        description="Run the model at batch sizes 1..N (several passes each, median), fit "
        "fixed + n * per_item by least squares, report the fit's quality and write a JSON "
        "profile for simulate, tune and serve (--profile FILE).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--model", default="minilm", metavar="SPEC", help="as `serve --model` takes it")
    p.add_argument("--max-batch-size", type=positive_int, default=32, help="largest size")
    p.add_argument("--sizes", type=_sizes, help="exact sizes to measure, e.g. 1,2,4,8,16,32")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed passes per size")
    p.add_argument("--warmup", type=int, default=2, help="untimed passes first")
    p.add_argument("--inputs", metavar="FILE", help="inputs to batch, one per line")
    p.add_argument("--input-words", type=positive_int, default=12, help="words per generated input")
    p.add_argument("-o", "--output", default="profile.json", help="where to write it")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    b = p.add_argument_group("backends of minilm, a model folder or a Hub id")
    b.add_argument(
        "--backend",
        metavar="LIST",
        help="'all' or e.g. torch,onnx,onnx-int8: profile each, with its quality figures",
    )
    b.add_argument(
        "--backends",
        action="store_true",
        help="measure every engine as serve's --backend auto does, at --max-batch-size; "
        "print the table and the choice, and cache it for serve",
    )
    b.add_argument("--device", help="auto, cpu, cuda, cuda:N, mps")
    b.add_argument(
        "--dtype",
        help="float32, float16, bfloat16, float16-mixed, bfloat16-mixed, int8 "
        "(what the machine computes in)",
    )
    b.add_argument("--threads", type=positive_int, help="CPU threads per pass")
    b.add_argument("--cache-dir", help="where exports are cached")
    b.add_argument("--revision", help="a Hub id's branch, tag or commit (as serve's)")
    b.add_argument(
        "--trust-remote-code",
        action="store_const",
        const="on",
        help="run the code a model folder ships (auto_map), as serve's",
    )
    b.add_argument("--quality-set", metavar="FILE", help="texts to compare on (JSON or lines)")
    b.add_argument("--no-quality", action="store_true", help="skip the quality comparison")
    p.set_defaults(run=run)


#: The query of a reranker's profiled pairs (a search query's few words).
PROFILE_QUERY = "how do I choose the right one"


def run(args: argparse.Namespace) -> int:
    """Profile the model, print the fit and write the file."""
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {args.warmup}")
    sizes = args.sizes or default_sizes(args.max_batch_size)
    lines: list[str] = []
    if args.inputs:
        text = Path(args.inputs).read_text(encoding="utf-8")
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            raise ConfigError(f"--inputs {args.inputs!r} holds no non-empty line")
    inputs = sample_inputs(max(sizes), words=args.input_words, lines=lines)
    if args.backends:
        from batchserve.cli.profile_backends import run_auto

        return run_auto(args)
    if args.backend:
        from batchserve.cli.profile_backends import run_backends

        return run_backends(args, sizes, inputs)
    from batchserve.cli.profile_backends import spec_options

    spec = args.model
    runtime = spec_options(args)
    if runtime:
        spec = with_runtime(spec, runtime)
    model = load_model(spec)
    items: list[Any] = list(inputs)
    if model.kind.item == "pair":
        # A reranker's item is a (query, passage) pair: the texts are the passages, each
        # asked by one short query, so the profile is the cost per pair.
        items = [(PROFILE_QUERY, text) for text in inputs]
    profile = profile_model(
        model.fn,
        model=spec,
        sizes=sizes,
        repeats=args.repeats,
        inputs=items,
        warmup=args.warmup,
    )
    save_profile(profile, args.output)
    if args.json:
        print(json.dumps(profile.to_dict()))
    else:
        print(format_profile(profile))
        print(f"wrote {args.output}")
    return 0


def format_profile(profile: Profile) -> str:
    """The measured points beside the fitted line, and the fit's quality."""
    out = [
        f"profile of {profile.model}: {len(profile.points)} batch sizes, "
        f"{profile.repeats} timed passes each (median)",
        "",
        "  size    median    fitted  residual",
    ]
    for n, s in profile.points:
        fitted = profile.fixed_s + n * profile.per_item_s
        rel = (s - fitted) / s if s > 0 else 0.0
        out.append(f"  {n:4d} {s * 1e3:7.3f}ms {fitted * 1e3:7.3f}ms {rel * 100:+8.2f}%")
    out += [
        "",
        f"fit: {format_duration(profile.fixed_s)} per pass + "
        f"{format_duration(profile.per_item_s)} per item "
        f"(R^2 {profile.r_squared:.5f}, worst residual {profile.max_rel_residual * 100:.2f}%)",
    ]
    return "\n".join(out)
