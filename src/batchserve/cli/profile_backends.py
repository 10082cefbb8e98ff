"""``batchserve profile --backend ...``: each backend's cost curve beside its quality figures.

For each backend of the built-in model (or a model folder), the model is loaded as
``serve`` loads it (an ONNX/OpenVINO export made once into the cache; an int8 backend that
failed its quality gate is shown as refused, with the figures that failed), its cost curve
is measured and fitted as plain ``profile`` does, and its embeddings of the quality set
(the shipped one, or ``--quality-set FILE``) are compared with torch fp32's: mean and min
cosine, and the fraction of retrieval queries whose nearest passage is unchanged. The
last lines put the backends side by side, so the trade of speed against quality is seen
at once. Each backend's profile is written to ``-o`` with the backend in its name.

``batchserve profile --backends`` (:func:`run_auto`) runs what ``serve --backend auto``
runs on its first start on a machine (:mod:`batchserve.engines.choice`), afresh, and prints
its table: every engine's rate at the batch size, its quality figures, the choice.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchserve.engines.loader import choose_engine, load_model, model_folder
from batchserve.engines.quality import MIN_MEAN_COSINE, MIN_RANKING_AGREEMENT, Quality, compare
from batchserve.engines.quality_set import QualitySet
from batchserve.engines.quality_set import load as load_quality_set
from batchserve.engines.quality_set import read as read_quality_set
from batchserve.engines.runtime import BACKENDS, Runtime
from batchserve.errors import ConfigError
from batchserve.models.loader import runs_on_engine, split_runtime, with_runtime
from batchserve.models.profiling import Profile, profile_model, save_profile
from batchserve.units import format_duration

__all__ = [
    "OPTION_FLAGS",
    "BackendResult",
    "format_backends",
    "parse_backends",
    "run_auto",
    "run_backends",
    "spec_options",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendResult:
    """One backend's figures.

    Attributes:
        backend: the backend's name.
        spec: the SPEC it was loaded from.
        profile: its measured cost curve (None if it was refused).
        quality: its embeddings against torch fp32's (None if not measured).
        refused: why it cannot be served (a failed gate, a missing extra), else None.
    """

    backend: str
    spec: str
    profile: Profile | None
    quality: Quality | None
    refused: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values."""
        return {
            "backend": self.backend,
            "spec": self.spec,
            "profile": self.profile.to_dict() if self.profile else None,
            "quality": self.quality.to_dict() if self.quality else None,
            "refused": self.refused,
        }


def parse_backends(text: str) -> list[str]:
    """``all`` or comma-separated backend names, in order, without repeats.

    Raises:
        ConfigError: a name is not a backend.
    """
    if text == "all":
        return [b for b in BACKENDS if b != "auto"]
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in BACKENDS or name == "auto":
            raise ConfigError(
                f"--backend must be 'all' or names from {', '.join(BACKENDS)}, got {name!r}"
            )
    return list(dict.fromkeys(names))


#: The flags of ``profile`` that become options of the model's SPEC.
OPTION_FLAGS = ("device", "dtype", "threads", "cache_dir", "revision", "trust_remote_code")


def spec_options(args: argparse.Namespace) -> dict[str, str]:
    """The options of the model's SPEC that ``profile``'s flags give."""
    return {k: str(v) for k in OPTION_FLAGS if (v := getattr(args, k, None)) is not None}


def run_auto(args: argparse.Namespace) -> int:
    """Measure every engine as ``--backend auto`` does; print (or ``--json``) the verdict."""
    base, options = split_runtime(with_runtime(args.model, spec_options(args)))
    if not runs_on_engine(base):
        raise ConfigError(
            f"--backends applies to minilm, a model folder or a Hub id, not {args.model!r}"
        )
    path = model_folder(base, options.pop("revision", None))
    fields: dict[str, Any] = {}
    for key, value in options.items():
        if key in ("threads", "batch_size"):
            fields[key] = int(value)
        elif key == "trust_remote_code":
            fields[key] = value.lower() in ("on", "true", "yes", "1")
        else:
            fields[key] = value
    fields.update(backend="auto", batch_size=args.max_batch_size)
    runtime = Runtime(**fields)
    _, verdict = choose_engine(path, runtime, refresh=True)
    if args.json:
        print(json.dumps(verdict.to_dict()))
    else:
        print(verdict.table())
        print(verdict.summary())
    return 0


def run_backends(args: argparse.Namespace, sizes: list[int], inputs: list[str]) -> int:
    """Profile and compare each backend of ``args.backend``; print and write the results."""
    options = spec_options(args)
    qs: QualitySet | None = None
    if not args.no_quality:
        qs = read_quality_set(Path(args.quality_set)) if args.quality_set else load_quality_set()
    reference: Any = None
    results: list[BackendResult] = []
    for backend in parse_backends(args.backend):
        spec = with_runtime(args.model, {**options, "backend": backend})
        try:
            model = load_model(spec)
        except (ConfigError, ImportError) as exc:
            results.append(
                BackendResult(
                    backend=backend, spec=spec, profile=None, quality=None, refused=str(exc)
                )
            )
            continue
        profile = profile_model(
            model.fn,
            model=spec,
            sizes=sizes,
            repeats=args.repeats,
            inputs=inputs,
            warmup=args.warmup,
        )
        quality = None
        if qs is not None:
            if reference is None:
                ref_spec = with_runtime(args.model, {**options, "backend": "torch"})
                reference = model.fn if backend == "torch" else load_model(ref_spec).fn
            precision = str((model.engine or {}).get("precision", "float32"))
            quality = compare(reference, model.fn, qs, precision=precision)  # type: ignore[arg-type]
        results.append(BackendResult(backend=backend, spec=spec, profile=profile, quality=quality))
        out = Path(args.output)
        save_profile(profile, out.with_name(f"{out.stem}-{backend}{out.suffix or '.json'}"))
    if args.json:
        print(json.dumps([r.to_dict() for r in results]))
    else:
        print(format_backends(results, max(sizes)))
    return 0


def format_backends(results: list[BackendResult], batch: int) -> str:
    """The side-by-side table: cost curve, throughput at ``batch``, quality, gate."""
    out = [
        f"{'backend':14} {'per pass':>9} {'per item':>9} {'R^2':>7} {f'items/s@{batch}':>12} "
        f"{'mean cos':>8} {'min cos':>8} {'NN kept':>7}  gate",
    ]
    for r in results:
        if r.profile is None:
            out.append(f"{r.backend:14} refused: {r.refused}")
            continue
        p, q = r.profile, r.quality
        rate = batch / (p.fixed_s + batch * p.per_item_s)
        figures = f"{'-':>8} {'-':>8} {'-':>7}"
        if q is not None:
            kept = f"{q.ranking_agreement * 100:6.1f}%" if q.queries else f"{'-':>7}"
            figures = f"{q.mean_cosine:8.4f} {q.min_cosine:8.4f} {kept}"
        gate = "-" if q is None else ("pass" if q.passes else "FAIL")
        out.append(
            f"{r.backend:14} {format_duration(p.fixed_s):>9} {format_duration(p.per_item_s):>9} "
            f"{p.r_squared:7.4f} {rate:12.1f} {figures}  {gate}"
        )
    out.append(
        f"gate (int8 is served only if it passes): mean cosine to torch fp32 >= "
        f"{MIN_MEAN_COSINE} and the nearest passage unchanged for >= "
        f"{MIN_RANKING_AGREEMENT:.0%} of queries"
    )
    return "\n".join(out)
