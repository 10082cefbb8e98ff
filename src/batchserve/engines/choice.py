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
   reference manual: mean cosine to float32 >= 0.99, every text's cosine >= 0.9999 at
   float32 and 0.999 at half precision, the nearest passage kept for >= 95%
   of queries, each paragraph's nearest neighbour kept for >= 95% and its ten nearest
   overlapping >= 0.9, batch invariance >= 0.9999: a text's vector alone and among
   random batch-mates the same, and every text at the model's edges within the same
   per-text floor of ``SentenceTransformer.encode``), fastest first, until one passes.
   The reference is held to the library on the edge texts too: if it misses one, the
   folder is refused (no engine gives its vectors). Invariance is screened
   first (seconds): an engine that fails it is refused without the full gate (a minute or
   more). The reference's own batch invariance is measured too, for the table.
4. :func:`~batchserve.engines.verdict.pick` (pure) serves the fastest engine that passed,
   or the reference when none did: ``auto`` never serves an engine that measured slower
   than torch float32, nor one whose answers depend on their batch-mates (dynamic int8: it
   stays available by name).

The :class:`~batchserve.engines.verdict.Verdict` (the choice and the table behind it) is
cached as JSON, keyed by the model's hash, the engines' versions, the machine's identity
and the settings measured at, so later starts on the same machine load the chosen engine
at once::

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
    Quality,
    invariance,
)
from batchserve.engines.quality_set import QualitySet
from batchserve.engines.runtime import usable_cores
from batchserve.engines.verdict import FORMAT, Figures, Trial, Verdict, gate_order, pick
from batchserve.errors import ConfigError
from batchserve.models.kinds import EMBEDDING, Kind

__all__ = [
    "EmbeddingJudge",
    "Judge",
    "choose",
    "cpu_share",
    "speed_texts",
]

_log = logging.getLogger(__name__)

#: Timed rounds per engine (the best counts).
ROUNDS = 2
#: Each engine's round runs its requests this many times over.
TIMED_REPEATS = 3
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

#: Loads an engine's batch function: (engine) -> fn. Raises ConfigError/ImportError.
EngineLoader = Callable[[Engine], Callable[[Sequence[str]], Any]]


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

    kind: Kind

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

    kind = EMBEDDING

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
            self._source,
            engine,
            fn,
            self._cache,
            quality_set=self._qs,
            workers=self._workers,
            reference=reference,
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
    cuda_graphs: bool = False,
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
        cuda_graphs: whether the torch engines replay their passes as CUDA graphs (on a
            GPU it changes their speed, so a verdict measured without them is not reused).

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
            # On the CPU there are no graphs: a CPU verdict's key is what it always was.
            **({"cuda_graphs": cuda_graphs} if device != "cpu" else {}),
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
    edges = getattr(ref_quality, "edges", None)
    if edges is not None and not edges.passes:
        # The reference tokenizes and pools through the pipeline every engine shares: if
        # it misses the library on a text, no engine here gives this folder's vectors.
        raise ConfigError(
            f"{source.name}: no engine gives this folder's vectors as sentence-transformers "
            f"does ({'; '.join(edges.failures())} on torch float32); it is not served"
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
