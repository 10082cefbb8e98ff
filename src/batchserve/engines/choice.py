"""``--backend auto``: measure every engine here, serve the fastest that keeps its quality.

Theory of operation: which engine is fastest (torch or ONNX Runtime or OpenVINO; float32,
bfloat16 or int8) depends on the CPU (AMX, VNNI, AVX-512, AVX2 only), the GPU, the text
lengths and the batch size, so it is measured on the machine, never assumed:

1. :func:`~batchserve.engines.hardware.candidates` lists the engines the machine's facts
   and the installed packages make possible (bfloat16 only where the CPU computes in it).
2. Each is loaded (an export is made once into the cache) and timed on real text of a
   realistic length mix (:func:`speed_texts`: the reference manual's paragraphs,
   :mod:`batchserve.engines.corpus`) in requests of the configured batch size, as an
   indexer sends them, so each engine runs them as it serves them: as length-sorted
   sub-passes (:mod:`batchserve.engines.passes`), whose padding saved is part of its speed.
   As many passes run at once as the server will run (``workers`` threads of ``threads``
   each), in rounds that alternate the engines so a neighbour's load falls on all alike;
   each round runs the requests :data:`TIMED_REPEATS` times over (once over swung a
   MiniLM-sized reranker's rate by a third between two runs on an idle machine) and the
   best round counts. After the first round only the reference and the engines within 80%
   of the best are timed again. A reranker's or classifier's engines are timed on what
   they serve (:class:`~batchserve.engines.ranking_gate.SequenceJudge`).
3. The engines faster than the reference (torch float32) go through the quality gate
   (:mod:`batchserve.engines.gate`, on the shipped set and the paragraphs of Python's
   reference manual: mean cosine to float32 >= 0.99, the nearest passage kept for >= 95%
   of queries, each paragraph's nearest neighbour kept for >= 95% and its ten nearest
   overlapping >= 0.9, and batch invariance >= 0.9999: a text's vector alone and among
   random batch-mates the same), fastest first, until one passes. Invariance is screened
   first (seconds): an engine that fails it is refused without the full gate (a minute or
   more). The reference's own batch invariance is measured too, for the table.
4. :func:`pick` (pure) serves the fastest engine that passed, or the reference when none
   did: ``auto`` never serves an engine that measured slower than torch float32, nor one
   whose answers depend on their batch-mates (dynamic int8: it stays available by name).

The :class:`Verdict` (the choice and the table behind it) is cached as JSON, keyed by the
model's hash, the engines' versions, the machine's identity and the settings measured at,
so later starts on the same machine load the chosen engine at once::

    CACHE/<name>-<model hash>/auto/<key>.json

Two processes that start at once on an empty cache both measure; the last to finish
writes the file. A damaged or foreign file is measured again. A verdict keeps the share of
the cores its timed passes got (:func:`cpu_share`): one timed while other work held them
says so in its summary, logged at every start, until it is measured again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from batchserve.engines.corpus import digest as corpus_digest
from batchserve.engines.corpus import speed_texts
from batchserve.engines.hardware import (
    REFERENCE,
    Engine,
    Machine,
    candidates,
    installed_backends,
)
from batchserve.engines.quality import (
    MIN_INVARIANCE,
    MIN_MEAN_COSINE,
    MIN_NEAREST_KEPT,
    MIN_RANKING_AGREEMENT,
    MIN_TOP10_OVERLAP,
    TOP_K,
    Quality,
    invariance,
)
from batchserve.engines.quality_set import QualitySet
from batchserve.engines.ranking_gate import SequenceVerdict
from batchserve.engines.runtime import usable_cores

__all__ = [
    "BUSY_SHARE",
    "EmbeddingJudge",
    "Figures",
    "Judge",
    "Trial",
    "Verdict",
    "choose",
    "cpu_share",
    "gate_order",
    "pick",
    "speed_texts",
]

_log = logging.getLogger(__name__)

#: Format of the cached verdict; a file of another format is measured again (3: timed on
#: the reference manual's paragraphs, each engine in sub-passes).
FORMAT = 3
#: Timed rounds per engine (the best counts).
ROUNDS = 2
#: Each engine's round runs its requests this many times over.
TIMED_REPEATS = 3
#: Below this share of the CPU the timed passes asked for, other work held the cores while
#: the engines were timed, and the verdict says so (its rates, and so its choice, may not
#: be what a quiet machine gives). Measured on a 2-core EPYC, two 1-thread workers: MiniLM
#: 0.92 idle; a MiniLM-sized reranker 0.81 idle (a round's tail and the tokenizer's lock
#: leave some of it) and 0.59 beside one busy process (which moved its choice from torch
#: bfloat16 to OpenVINO bfloat16).
BUSY_SHARE = 0.7
#: After the first round, engines below this fraction of the best rate are not timed again.
CONTENDERS = 0.8
_PACKAGES = (
    "torch",
    "transformers",
    "sentence-transformers",
    "onnxruntime",
    "onnx",
    "openvino",
    "nncf",
)

#: A candidate's quality figures: an embedder's, or a reranker's or classifier's.
Figures = Quality | SequenceVerdict

#: Loads an engine's batch function: (engine) -> fn. Raises ConfigError/ImportError.
EngineLoader = Callable[[Engine], Callable[[Sequence[str]], Any]]


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
    # A reranker's or classifier's figures say their kind; an embedder's do not.
    if data.get("kind") in ("reranker", "classifier"):
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
        kind: the kind of model measured (``embedding``, ``reranker``, ``classifier``):
            what its items were and which gate it went through.
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
    kind: str = "embedding"
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
        sequence = self.kind in ("reranker", "classifier")
        unit = "pairs/s" if self.kind == "reranker" else "texts/s"
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
                MIN_LABEL_KEPT,
                MIN_SPEARMAN,
                MIN_TOP_KEPT,
                SCORE_TOLERANCE,
            )

            lines += [
                "* served. Gated against torch/float32 (engines slower than it are not): a "
                f"reranker's Spearman >= {MIN_SPEARMAN},",
                f"  top passage kept >= {MIN_TOP_KEPT:.0%} and scores within {SCORE_TOLERANCE}; "
                f"a classifier's label kept >= {MIN_LABEL_KEPT:.0%};",
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
            f"{MIN_TOP10_OVERLAP} (top-10), and a text's vector",
            f"  alone vs in a batch >= {MIN_INVARIANCE} (invariant).",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (what the cache file, ``/status`` and profile --json hold)."""
        return {
            "format": FORMAT,
            "kind": self.kind,
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
            kind=str(data.get("kind", "embedding")),
            cpu_share=None if data.get("cpu_share") is None else float(data["cpu_share"]),
        )


_EMBEDDING_HEAD = (
    f"{'mean cos':>8} {'min cos':>8} {'QA kept':>7} {'NN kept':>7} {'top-10':>6} {'invariant':>9}"
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
        return f"{'-':>8} {'-':>8} {'-':>7} {'-':>7} {'-':>6} {screened}"
    qa = f"{q.ranking_agreement:7.1%}" if q.queries else f"{'-':>7}"
    kept = f"{q.nearest_kept:7.1%}" if q.nearest_kept is not None else f"{'-':>7}"
    overlap = f"{q.top10_overlap:6.3f}" if q.top10_overlap is not None else f"{'-':>6}"
    invariant = f"{q.invariance:9.6f}" if q.probes else f"{'-':>9}"
    return f"{q.mean_cosine:8.4f} {q.min_cosine:8.4f} {qa} {kept} {overlap} {invariant}"


def _verdict(t: Trial) -> str:
    if t.engine == REFERENCE:
        return "reference"
    if t.screened_out:
        return "FAIL: invariance (screened; not gated further)"
    if t.quality is None:
        return "-"
    failed = t.quality.failed_bounds()
    return "FAIL: " + ", ".join(failed) if failed else "pass"


def versions() -> dict[str, str]:
    """The installed versions of the packages an engine's speed depends on."""
    from batchserve.engines.export import RECIPE

    out = {"batchserve-export-recipe": str(RECIPE)}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _rate(
    fn: Callable[[Sequence[Any]], Any],
    batches: list[list[Any]],
    workers: int,
    *,
    repeats: int = TIMED_REPEATS,
) -> float:
    # The batches are run `repeats` times over by `workers` threads at once, as the server's
    # workers run passes; items per wall second. (Once over, a fraction of a second for a
    # MiniLM-sized reranker, swung an engine's rate by a third between runs on an idle
    # machine.)
    order = [b for _ in range(max(1, repeats)) for b in batches]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        while True:
            with lock:
                if not order:
                    return
                batch = order.pop()
            try:
                fn(batch)
            except BaseException as exc:
                errors.append(exc)
                return

    total = sum(len(b) for b in order)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return total / max(time.perf_counter() - t0, 1e-9)


def cpu_share(wall_from: float, cpu_from: float, cores: int) -> float:
    """The share of ``cores`` this process used since the clocks read the values given.

    ``wall_from`` is a ``time.perf_counter()``, ``cpu_from`` a ``time.process_time()``
    (every thread's CPU seconds). The share is the CPU seconds since over the wall seconds
    times ``cores``, at most 1: below 1, other work ran on those cores meanwhile, or the
    process waited.
    """
    wall = (time.perf_counter() - wall_from) * max(1, cores)
    return round(min(1.0, (time.process_time() - cpu_from) / wall), 3) if wall > 0 else 1.0


def _cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _read_cached(path: Path) -> Verdict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return dataclasses.replace(Verdict.from_dict(data), cached=True)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log.warning("ignoring the cached verdict %s (%s); measuring again", path, exc)
        return None


class Judge(Protocol):
    """What ``choose`` needs of a kind of model: what to time it on, and how to gate it.

    :class:`EmbeddingJudge` for an embedder;
    :class:`~batchserve.engines.ranking_gate.SequenceJudge` for a reranker or classifier.
    """

    kind: str

    def key(self) -> dict[str, Any]:
        """What the verdict depends on besides the engines, machine and settings."""
        ...

    def batches(self, batch_size: int, workers: int) -> list[list[Any]]:
        """The requests the engines are timed on."""
        ...

    def unavailable(self, engine: Engine) -> str | None:
        """Why ``engine`` is not offered for this kind of model (None: it is)."""
        ...

    def screen(self, fn: Callable[[Sequence[Any]], Any], batch_size: int) -> float:
        """The batch invariance of ``fn`` (seconds): refused below ``MIN_INVARIANCE``."""
        ...

    def reference(
        self, fn: Callable[[Sequence[Any]], Any], batch_size: int
    ) -> tuple[Figures | None, float | None]:
        """The reference's own figures, for the table: (gate figures, invariance)."""
        ...

    def gate(
        self,
        engine: Engine,
        fn: Callable[[Sequence[Any]], Any],
        reference: Callable[[Sequence[Any]], Any],
    ) -> Figures:
        """``engine``'s quality figures against the reference."""
        ...


class EmbeddingJudge:
    """How ``auto`` times and gates an embedder's engines.

    Timed on the reference manual's paragraphs, gated by cosine, retrieval and neighbours
    (:func:`batchserve.engines.gate.gate`, cached per engine).

    Args:
        source: the model folder.
        cache_dir: the cache folder (the gate's figures and reference vectors).
        quality_set: the gate's texts.
        workers: passes at once.
    """

    kind = "embedding"

    def __init__(
        self, source: Path, cache_dir: Path, quality_set: QualitySet, workers: int
    ) -> None:
        self._source, self._cache, self._qs, self._workers = source, cache_dir, quality_set, workers

    def key(self) -> dict[str, Any]:
        """The gate's set and the timed paragraphs (as verdicts before kinds were keyed)."""
        from batchserve.engines.gate import set_digest

        return {"set": set_digest(self._qs), "speed_texts": corpus_digest()}

    def batches(self, batch_size: int, workers: int) -> list[list[Any]]:
        """:func:`~batchserve.engines.corpus.speed_texts`."""
        return [list(b) for b in speed_texts(batch_size, workers)]

    def unavailable(self, engine: Engine) -> str | None:
        """Every engine is offered for an embedder: None."""
        del engine
        return None

    def screen(self, fn: Callable[[Sequence[Any]], Any], batch_size: int) -> float:
        """The smallest cosine of a text alone to it in a batch."""
        worst, _ = invariance(fn, self._qs.texts, batch_size=batch_size)
        return worst

    def reference(
        self, fn: Callable[[Sequence[Any]], Any], batch_size: int
    ) -> tuple[Quality, None]:
        """The reference gated against itself: its invariance (seconds)."""
        return self.gate(REFERENCE, fn, fn), None

    def gate(
        self,
        engine: Engine,
        fn: Callable[[Sequence[Any]], Any],
        reference: Callable[[Sequence[Any]], Any],
    ) -> Quality:
        """:func:`batchserve.engines.gate.gate` (the reference's vectors are cached)."""
        from batchserve.engines.gate import gate

        return gate(
            self._source, engine, fn, self._cache, quality_set=self._qs, workers=self._workers
        )


def choose(
    source: Path,
    *,
    device: str,
    threads: int,
    workers: int,
    batch_size: int,
    cache_dir: Path,
    load: EngineLoader,
    dtype: str = "auto",
    machine: Machine | None = None,
    installed: set[str] | None = None,
    quality_set: QualitySet | None = None,
    judge: Judge | None = None,
    refresh: bool = False,
    rounds: int = ROUNDS,
    repeats: int = TIMED_REPEATS,
) -> tuple[Verdict, Callable[[Sequence[Any]], Any] | None]:
    """The engine to serve ``source`` on, measured here or read from the cache.

    Blocks while measuring: on the first start on a machine, every engine is exported,
    loaded, timed, and the fastest gated (for MiniLM on two cores: about two minutes to
    time them, then the reference's vectors of the gate's texts, once, and a minute or so
    per engine gated).

    Args:
        source: the model folder.
        device: the resolved device.
        threads: CPU threads per pass.
        workers: passes at once.
        batch_size: the batch size to time at.
        cache_dir: the cache folder.
        load: loads one engine (the same as serving it would).
        dtype: ``auto``, or the one precision to choose among.
        machine: the facts; None reads them.
        installed: the installed backends; None looks them up.
        quality_set: the gate's texts; None is the shipped set (or $BATCHSERVE_QUALITY_SET).
        judge: what the engines are timed on and gated by (the kind of model); None: an
            embedder's (:class:`EmbeddingJudge`).
        refresh: measure even when a verdict is cached.
        rounds: timed rounds per engine.
        repeats: how many times over an engine's round runs the requests.

    Returns:
        The verdict, and the chosen engine's batch function when it was loaded while
        measuring (None on a cached verdict: load it).
    """
    from batchserve.engines.export import model_folder, write_cached
    from batchserve.engines.gate import default_quality_set

    facts = machine or Machine.here()
    qs = quality_set if quality_set is not None else default_quality_set()
    judge = judge if judge is not None else EmbeddingJudge(source, cache_dir, qs, workers)
    folder = model_folder(source, cache_dir)
    versions_now = versions()
    key = _cache_key(
        {
            "model": folder.name,
            "versions": versions_now,
            "machine": facts.identity(),
            "device": device,
            "dtype": dtype,
            "batch_size": batch_size,
            "threads": threads,
            "workers": workers,
            **judge.key(),
            "format": FORMAT,
        }
    )
    path = folder / "auto" / f"{key}.json"
    if not refresh and (cached := _read_cached(path)) is not None:
        return cached, None

    start = time.perf_counter()
    options = candidates(
        facts, device, installed if installed is not None else installed_backends(), dtype=dtype
    )
    # The reference must load (it is what the others are gated against): its error is the
    # caller's. Any other engine that cannot load is reported in the table, not fatal.
    fns: dict[Engine, Callable[[Sequence[Any]], Any]] = {REFERENCE: load(REFERENCE)}
    unavailable: dict[Engine, str] = {}
    for option in options:
        if option.engine == REFERENCE:
            continue
        reason = option.unavailable or judge.unavailable(option.engine)
        if reason is not None:
            unavailable[option.engine] = reason
            continue
        try:
            fns[option.engine] = load(option.engine)
        except Exception as exc:
            unavailable[option.engine] = f"failed to load: {exc}"
            _log.warning("backend auto: %s failed to load: %s", option.engine, exc)
    batches = judge.batches(batch_size, workers)
    rates: dict[Engine, float] = {}
    for fn in fns.values():  # a first pass of each shape, untimed
        fn(batches[0][:2])
    timed_from = (time.perf_counter(), time.process_time())
    for round_ in range(max(1, rounds)):
        # Rounds after the first time only the contenders (within CONTENDERS of the best so
        # far) and the reference: an engine far behind cannot win on a second try.
        best = max(rates.values(), default=0.0)
        for engine, fn in fns.items():
            if round_ and engine != REFERENCE and rates[engine] < CONTENDERS * best:
                continue
            rates[engine] = max(
                rates.get(engine, 0.0), round(_rate(fn, batches, workers, repeats=repeats), 2)
            )
    share = (
        None if device != "cpu" else cpu_share(*timed_from, min(usable_cores(), workers * threads))
    )
    trials = {
        o.engine: Trial(
            engine=o.engine, items_per_s=rates.get(o.engine), unavailable=unavailable.get(o.engine)
        )
        for o in options
    }
    # The reference's own figures (its invariance: seconds), for the table; then the engines
    # faster than it, fastest first, until one passes. The invariance screen (seconds) goes
    # first: an engine whose answers depend on the batch (dynamic int8) is refused without
    # the minute its full gate would cost.
    ref_quality, ref_invariance = judge.reference(fns[REFERENCE], batch_size)
    trials[REFERENCE] = dataclasses.replace(
        trials[REFERENCE], quality=ref_quality, invariance=ref_invariance
    )
    for engine in gate_order(list(trials.values())):
        screen = judge.screen(fns[engine], batch_size)
        trials[engine] = dataclasses.replace(trials[engine], invariance=screen)
        if screen < MIN_INVARIANCE:
            _log.warning(
                "backend auto: %s refused: an item's answer alone and in a batch differ "
                "(invariance %.6f, must be >= %s); not gated further",
                engine,
                screen,
                MIN_INVARIANCE,
            )
            continue
        quality = judge.gate(engine, fns[engine], fns[REFERENCE])
        trials[engine] = dataclasses.replace(trials[engine], quality=quality)
        if quality.passes:
            break
    chosen = pick(list(trials.values()))
    verdict = Verdict(
        chosen=chosen,
        kind=judge.kind,
        device=device,
        batch_size=batch_size,
        threads=threads,
        workers=workers,
        trials=tuple(trials.values()),
        machine=facts.to_dict(),
        versions=versions_now,
        key=key,
        seconds=time.perf_counter() - start,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        cpu_share=share,
    )
    write_cached(path, json.dumps(verdict.to_dict(), indent=1).encode())
    return verdict, fns.get(chosen)
