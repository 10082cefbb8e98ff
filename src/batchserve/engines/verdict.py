"""What ``--backend auto`` measured and chose: each engine's trial, the pick, the verdict.

Pure records and rules, no measuring (that is :mod:`batchserve.engines.choice`):

* :class:`Trial`: one engine's rate, quality figures and invariance screen.
* :func:`pick` and :func:`gate_order`: which engine to serve, and which to gate first,
  from plain numbers (tested without a model).
* :class:`Verdict`: the choice and the trials behind it, as cached (JSON, :data:`FORMAT`),
  shown in ``/status`` and Triton's config, and printed as a table and a summary line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchserve.engines.edges import FLOAT32_FLOOR, HALF_FLOOR
from batchserve.engines.hardware import REFERENCE, Engine
from batchserve.engines.quality import (
    MIN_INVARIANCE,
    MIN_MEAN_COSINE,
    MIN_NEAREST_KEPT,
    MIN_RANKING_AGREEMENT,
    MIN_TOP10_OVERLAP,
    TOP_K,
    Quality,
)
from batchserve.engines.ranking_gate import GATES, SequenceVerdict
from batchserve.models.kinds import EMBEDDING, Kind, kind_named

__all__ = ["BUSY_SHARE", "FORMAT", "Figures", "Trial", "Verdict", "gate_order", "pick"]

#: Format of the cached verdict; a file of another format is measured again (3: timed on
#: the reference manual's paragraphs, each engine in sub-passes; 4: a per-text floor and
#: the edge texts against the library).
FORMAT = 4
#: Below this share of the CPU the timed passes asked for, other work held the cores while
#: the engines were timed, and the verdict says so (its rates, and so its choice, may not
#: be what a quiet machine gives). Measured on a 2-core EPYC, two 1-thread workers: MiniLM
#: 0.92 idle; a MiniLM-sized reranker 0.81 idle (a round's tail and the tokenizer's lock
#: leave some of it) and 0.59 beside one busy process (which moved its choice from torch
#: bfloat16 to OpenVINO bfloat16).
BUSY_SHARE = 0.7

#: A candidate's quality figures: an embedder's, or a reranker's or classifier's.
Figures = Quality | SequenceVerdict


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """One engine's figures.

    Attributes:
        engine: the engine.
        items_per_s: texts per second at the batch size, with the server's passes at once;
            None when it did not run.
        quality: its quality figures, when it was gated (None: not needed, or the
            reference itself).
        unavailable: why it did not run (the machine, a missing package, a load error).
        invariance: the batch invariance the screen measured before the full gate (the
            smallest cosine of a text alone to it in a batch); None when not screened.
            An engine that fails the screen is not gated further.
    """

    engine: Engine
    items_per_s: float | None = None
    quality: Figures | None = None
    unavailable: str | None = None
    invariance: float | None = None

    @property
    def screened_out(self) -> bool:
        """Whether the invariance screen refused it (its answers depend on the batch)."""
        return self.invariance is not None and self.invariance < MIN_INVARIANCE

    @property
    def gated(self) -> bool | None:
        """True when it may be served on quality, False when it failed, None when unknown."""
        if self.engine == REFERENCE:
            return True
        if self.screened_out:
            return False
        return None if self.quality is None else self.quality.passes

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values."""
        return {
            "backend": self.engine.backend,
            "precision": self.engine.dtype,
            "items_per_s": None if self.items_per_s is None else round(self.items_per_s, 2),
            "quality": None if self.quality is None else self.quality.to_dict(),
            "gated": self.gated,
            "unavailable": self.unavailable,
            "invariance": self.invariance,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trial:
        """Read back what :meth:`to_dict` wrote."""
        quality = data.get("quality")
        rate = data.get("items_per_s")
        return cls(
            engine=Engine(str(data["backend"]), str(data["precision"])),
            items_per_s=None if rate is None else float(rate),
            quality=_figures_from_dict(quality) if quality else None,
            unavailable=data.get("unavailable"),
            invariance=None if data.get("invariance") is None else float(data["invariance"]),
        )


def _figures_from_dict(data: dict[str, Any]) -> Figures:
    # A reranker's or classifier's figures say their kind (by its name); an embedder's do not.
    if "kind" in data and kind_named(str(data["kind"])).gate in GATES:
        return SequenceVerdict.from_dict(data)
    return Quality.from_dict(data)


def pick(trials: Sequence[Trial]) -> Engine:
    """The engine to serve: the fastest that passed the gate, else the reference.

    Only engines that ran and passed (the reference passes by definition) are eligible,
    so the choice is never slower than the reference as measured.
    """
    eligible = [t for t in trials if t.items_per_s is not None and t.gated]
    if not eligible:
        return REFERENCE
    return max(eligible, key=lambda t: (t.items_per_s, t.engine == REFERENCE)).engine


def gate_order(trials: Sequence[Trial]) -> list[Engine]:
    """The engines worth gating: those measured faster than the reference, fastest first."""
    ref = next((t.items_per_s for t in trials if t.engine == REFERENCE), None)
    faster = [
        t
        for t in trials
        if t.engine != REFERENCE
        and t.items_per_s is not None
        and (ref is None or t.items_per_s > ref)
    ]
    return [t.engine for t in sorted(faster, key=lambda t: -(t.items_per_s or 0.0))]


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What ``auto`` chose, and the measurements behind it.

    Attributes:
        chosen: the engine served.
        device: where it runs.
        batch_size: the batch size measured at.
        threads: CPU threads per pass.
        workers: passes at once.
        trials: every candidate's figures, the reference first.
        machine: the machine's facts (:meth:`~batchserve.engines.hardware.Machine.to_dict`).
        versions: the engines' package versions.
        key: the cache key.
        seconds: what measuring cost (loads and exports included).
        created: when it was measured (ISO 8601, UTC).
        cached: whether this start read it from the cache.
        kind: the kind of model measured (:mod:`batchserve.models.kinds`): what its items
            were and which gate it went through (its name in :meth:`to_dict`).
        cpu_share: on the CPU, the share of the cores the timed passes asked for that they
            got: this process's CPU seconds over the wall seconds timed times
            ``min(cores, workers x threads)``, at most 1 (None: timed on a GPU, or read
            from a verdict that predates it). Below :data:`BUSY_SHARE`, other work took
            the cores while the engines were timed.
    """

    chosen: Engine
    device: str
    batch_size: int
    threads: int
    workers: int
    trials: tuple[Trial, ...]
    machine: dict[str, Any]
    versions: dict[str, str]
    key: str
    seconds: float
    created: str
    cached: bool = False
    kind: Kind = EMBEDDING
    cpu_share: float | None = None

    def busy(self) -> bool:
        """Whether other work held the cores while the engines were timed."""
        return self.cpu_share is not None and self.cpu_share < BUSY_SHARE

    def trial(self, engine: Engine) -> Trial | None:
        """The figures of ``engine``, if it was a candidate."""
        return next((t for t in self.trials if t.engine == engine), None)

    def speedup(self) -> float | None:
        """The chosen engine's rate over the reference's, as measured."""
        chosen, ref = self.trial(self.chosen), self.trial(REFERENCE)
        if chosen is None or ref is None or not chosen.items_per_s or not ref.items_per_s:
            return None
        return chosen.items_per_s / ref.items_per_s

    def summary(self) -> str:
        """One line: the choice, its rate against the reference, where it came from."""
        up = self.speedup()
        rate = f" ({up:.2f}x torch/float32)" if up is not None else ""
        where = "cached" if self.cached else f"measured in {self.seconds:.0f}s"
        line = (
            f"backend auto chose {self.chosen}{rate} at batch {self.batch_size}, "
            f"{self.workers} x {self.threads}-thread passes on {self.device} ({where})"
        )
        if self.busy():
            line += (
                f"; timed while other work held the CPU (the passes got {self.cpu_share:.0%} "
                "of the cores they asked for): measure again when the machine is quiet "
                "(batchserve profile --backends, with the serve's --model and flags)"
            )
        return line

    def table(self) -> str:
        """The candidates side by side: rate, speed-up, every quality figure, gate, choice."""
        ref = self.trial(REFERENCE)
        base = ref.items_per_s if ref is not None else None
        sequence = self.kind.gate in GATES
        unit = f"{self.kind.item or 'item'}s/s"
        head = _SEQUENCE_HEAD if sequence else _EMBEDDING_HEAD
        lines = [f"{'engine':24} {unit:>8} {'vs fp32':>7} {head}  gate"]
        for t in self.trials:
            name = str(t.engine) + (" *" if t.engine == self.chosen else "")
            if t.items_per_s is None:
                lines.append(f"{name:24} {'-':>8} {'-':>7}  {t.unavailable or 'not run'}")
                continue
            up = f"{t.items_per_s / base:6.2f}x" if base else f"{'-':>7}"
            figures = _sequence_figures(t) if sequence else _figures(t)
            lines.append(f"{name:24} {t.items_per_s:8.1f} {up} {figures}  {_verdict(t)}")
        if sequence:
            from batchserve.engines.ranking_gate import (
                FLOAT32_SCORE,
                HALF_SCORE,
                MIN_LABEL_KEPT,
                MIN_SPEARMAN,
                MIN_TOP_KEPT,
                SCORE_TOLERANCE,
            )

            lines += [
                "* served. Gated against torch/float32 (engines slower than it are not): a "
                f"reranker's Spearman >= {MIN_SPEARMAN},",
                f"  top passage kept >= {MIN_TOP_KEPT:.0%}; a classifier's label kept >= "
                f"{MIN_LABEL_KEPT:.0%}; every score within {FLOAT32_SCORE} at float32",
                f"  ({HALF_SCORE} at half precision, {SCORE_TOLERANCE} at int8), every order and "
                "label kept but for ties within it;",
                f"  and an item's score alone vs in a batch: 1 - its change >= {MIN_INVARIANCE}"
                " (invariant).",
            ]
            return "\n".join(lines)
        lines += [
            "* served. Gated against torch/float32 (engines slower than it are not): mean "
            f"cosine >= {MIN_MEAN_COSINE},",
            f"  nearest passage kept for >= {MIN_RANKING_AGREEMENT:.0%} of queries (QA kept), "
            f"each paragraph's nearest kept for",
            f"  >= {MIN_NEAREST_KEPT:.0%} (NN kept), its {TOP_K} nearest overlapping >= "
            f"{MIN_TOP10_OVERLAP} (top-10), a text's vector",
            f"  alone vs in a batch >= {MIN_INVARIANCE} (invariant); every text's cosine "
            f"(min cos) >= {FLOAT32_FLOOR} at float32,",
            f"  {HALF_FLOOR} at half precision, and on each text at the model's edges to "
            "sentence-transformers itself (edges).",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (what the cache file, ``/status`` and profile --json hold)."""
        return {
            "format": FORMAT,
            "kind": self.kind.name,
            "chosen": {"backend": self.chosen.backend, "precision": self.chosen.dtype},
            "speedup_vs_torch_fp32": None if (up := self.speedup()) is None else round(up, 3),
            "device": self.device,
            "batch_size": self.batch_size,
            "threads": self.threads,
            "workers": self.workers,
            "trials": [t.to_dict() for t in self.trials],
            "machine": self.machine,
            "versions": self.versions,
            "key": self.key,
            "seconds": round(self.seconds, 1),
            "created": self.created,
            "cached": self.cached,
            "cpu_share": self.cpu_share,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        """Read back what :meth:`to_dict` wrote.

        Raises:
            ValueError: another format.
            KeyError: a field is missing.
        """
        if data.get("format") != FORMAT:
            raise ValueError(f"verdict format {data.get('format')!r}, expected {FORMAT}")
        chosen = data["chosen"]
        return cls(
            chosen=Engine(str(chosen["backend"]), str(chosen["precision"])),
            device=str(data["device"]),
            batch_size=int(data["batch_size"]),
            threads=int(data["threads"]),
            workers=int(data["workers"]),
            trials=tuple(Trial.from_dict(t) for t in data["trials"]),
            machine=dict(data["machine"]),
            versions={str(k): str(v) for k, v in data["versions"].items()},
            key=str(data["key"]),
            seconds=float(data["seconds"]),
            created=str(data["created"]),
            cached=bool(data.get("cached", False)),
            kind=kind_named(str(data.get("kind", EMBEDDING.name))),
            cpu_share=None if data.get("cpu_share") is None else float(data["cpu_share"]),
        )


_EMBEDDING_HEAD = (
    f"{'mean cos':>8} {'min cos':>8} {'QA kept':>7} {'NN kept':>7} {'top-10':>6} "
    f"{'edges':>8} {'invariant':>9}"
)
_SEQUENCE_HEAD = f"{'Spearman':>8} {'top kept':>8} {'score':>7} {'label':>7} {'invariant':>9}"


def _sequence_figures(t: Trial) -> str:
    q = t.quality
    invariant = f"{t.invariance:9.6f}" if t.invariance is not None else f"{'-':>9}"
    if not isinstance(q, SequenceVerdict):
        return f"{'-':>8} {'-':>8} {'-':>7} {'-':>7} {invariant}"

    def cell(value: float | None, width: int, fmt: str) -> str:
        return f"{value:{width}{fmt}}" if value is not None else f"{'-':>{width}}"

    return (
        f"{cell(q.spearman_mean, 8, '.4f')} {cell(q.top_kept, 8, '.1%')} "
        f"{cell(q.max_score_diff, 7, '.4f')} {cell(q.label_kept, 7, '.1%')} {invariant}"
    )


def _figures(t: Trial) -> str:
    q = t.quality
    if not isinstance(q, Quality):
        screened = f"{t.invariance:9.6f}" if t.invariance is not None else f"{'-':>9}"
        return f"{'-':>8} {'-':>8} {'-':>7} {'-':>7} {'-':>6} {'-':>8} {screened}"
    qa = f"{q.ranking_agreement:7.1%}" if q.queries else f"{'-':>7}"
    kept = f"{q.nearest_kept:7.1%}" if q.nearest_kept is not None else f"{'-':>7}"
    overlap = f"{q.top10_overlap:6.3f}" if q.top10_overlap is not None else f"{'-':>6}"
    invariant = f"{q.invariance:9.6f}" if q.probes else f"{'-':>9}"
    edges = f"{q.edges.min_cosine:8.6f}" if q.edges is not None else f"{'-':>8}"
    return f"{q.mean_cosine:8.4f} {q.min_cosine:8.4f} {qa} {kept} {overlap} {edges} {invariant}"


def _verdict(t: Trial) -> str:
    if t.engine == REFERENCE:
        return "reference"
    if t.screened_out:
        return "FAIL: invariance (screened; not gated further)"
    if t.quality is None:
        return "-"
    failed = t.quality.failed_bounds()
    return "FAIL: " + ", ".join(failed) if failed else "pass"
