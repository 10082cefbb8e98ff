"""A GPU's figures in one run: served against encode, the cost learned, the simulator.

Run by ``bench/gpu/run.sh`` (which first installs what the machine lacks), or alone from
the repository root:

    python bench/gpu/measure.py --out DIR [--budget 300] [--dry-run]

For each model, the built-in all-MiniLM-L6-v2 and a random-weight encoder of BERT-large's
shape (24 layers x 1024, built here with MiniLM's tokenizer, mean pooling, a 512-token
window), on the real paragraphs of Python's reference manual:

1. **encode**: ``SentenceTransformer.encode`` in this process on the same GPU, every text
   at each batch size of :data:`BATCH_SIZES`, at float32 and at the precision served; the
   best rate of each precision is the yardstick the served rates are divided by;
2. **cost**: the served engine's sub-pass cost (fixed, per token, attention) learned by
   the engine itself from passes of one length (``n`` items of ``L`` tokens), beside the
   prior it starts from (``batchserve.engines.passes.prior``); and the cost of a whole
   call (tokenizing included) with ``--workers`` passes at once, which the simulator is
   given;
3. **served**: ``batchserve serve`` on the GPU (MiniLM as ``--backend auto`` chooses, its
   verdict recorded; BERT-large at float16), driven by ``batchserve load`` open loop with
   32 texts a request and with one, past saturation (the rate is raised until the server
   refuses or times out some) and at half what it then cleared. Beside each: the server's
   own records (passes, their mean size, the cost it learned), the GPU's utilisation
   (NVML, sampled every 50 ms), and the CPU of the server's event loop (its main thread)
   and of its other threads (the workers: tokenizing, launching kernels), from which the
   row names what limited it. Also the settings a user gets by default (``--max-batch-size
   32``, one worker) and one worker alone;
4. **several servers**: one text a request over several servers on the one GPU, each sent
   its share of the load;
5. **simulated**: the simulator (the server's own policy) with the call's cost from step 2,
   the same settings and the same load of 32 texts a request: its texts/s beside the
   served.

Writes into ``--out`` the manual's result files (``gpu_encode.json``, ``gpu_served.json``,
``gpu_cost.json``, ``gpu_engines.json``, ``gpu_sim.json``; the format of
``docs/results/``) and ``gpu_raw.json`` (every figure), each rewritten as the run goes, and
prints a short table last. ``--budget`` bounds the run: a step that no longer fits is
skipped and the files say so. ``--dry-run`` runs every step on the CPU with a two-layer
stand-in for BERT-large, loads of a second and small rates: it checks this script, its
imports and the files it writes, and measures nothing worth keeping.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from batchserve.config import BatchConfig, CostEstimate
from batchserve.loadgen.texts import reference_paragraphs
from batchserve.sim import simulate
from batchserve.subpasses import PassCost, PassCostModel, Shape
from batchserve_testing.bench import load_report, start_load
from batchserve_testing.harness import Server

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Batch sizes ``encode`` is timed at; its best is the yardstick.
BATCH_SIZES = (32, 64, 128, 256, 512, 1024)
#: The served settings beside the defaults: passes of up to 256 texts, two workers (one
#: tokenizes and launches while the other's kernels run).
TUNED = {"max_batch_size": 256, "workers": 2}
DEFAULTS = {"max_batch_size": 32, "workers": 1}
MAX_WAIT_MS = 2
DEADLINE_S = 2.0
QUEUE = 8192
#: A run past saturation must see at least this share refused or timed out; else the rate
#: is raised by :data:`RAISE` and it runs again (at most :data:`RAISES` times).
SATURATED_SHARE = 0.02
RAISE = 1.6
RAISES = 2
#: Servers sharing the GPU in step 4.
SERVERS = 4
#: The steps, in the order they run (``--only`` picks some).
STEPS = ("encode", "served", "cost", "sim", "several", "settings")
#: The reference engine, as a verdict's trials name it.
REF = ("torch", "float32")
#: (items, tokens) of the one-length passes the cost is learned from.
PROFILE_ITEMS = (1, 8, 32, 64, 128)
PROFILE_TOKENS = (16, 32, 64, 128, 256)


@dataclass(frozen=True, slots=True, kw_only=True)
class Model:
    """A model measured: its name, folder, the precision served, whether ``auto`` chooses it,
    how many texts encode is timed on, and whether it is served by several servers too."""

    name: str
    label: str
    path: pathlib.Path
    served_dtype: str
    auto: bool
    texts: int
    several: bool = False


@dataclass(slots=True)
class Run:
    """What the run has measured so far, and where it writes it."""

    out: pathlib.Path
    budget_end: float
    dry: bool
    device: str
    machine: str
    command: str
    raw: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    date: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    )

    def left(self) -> float:
        """Seconds of the budget left."""
        return self.budget_end - time.monotonic()

    def fits(self, step: str, seconds: float) -> bool:
        """Whether ``step`` (about ``seconds`` long) fits the budget; a skip is recorded."""
        if self.left() >= seconds:
            return True
        self.skipped.append(f"{step}: {seconds:.0f} s wanted, {self.left():.0f} s left")
        log(f"skipped {step}: the budget has {self.left():.0f} s left")
        return False


def log(message: str) -> None:
    """One line on stderr, with the time."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the machine ---------------------------------------------------------------------------


def describe_machine(device: str) -> str:
    """The GPU (name, memory, capability, driver), torch and CUDA, the CPU's cores."""
    import torch

    parts = []
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        cap = f"{props.major}.{props.minor}"
        driver = ""
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            driver = f", driver {pynvml.nvmlSystemGetDriverVersion()}"
        parts.append(
            f"{props.name} ({props.total_memory / 2**20:.0f} MiB, compute capability {cap}"
            f"{driver}), torch {torch.__version__}, CUDA {torch.version.cuda}"
        )
    else:
        parts.append(f"no GPU (a dry run on {platform.processor() or platform.machine()})")
    from batchserve.engines.hardware import Machine

    parts.append(f"{Machine.here(gpus=False).cpu_model}, {os.cpu_count()} CPU cores")
    return ", ".join(parts)


class GpuSampler:
    """The GPU's utilisation (NVML, every 50 ms) while the block runs; None off a GPU."""

    def __init__(self, device: str) -> None:
        self._on = device.startswith("cuda")
        self._samples: list[int] = []
        self._memory: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if not self._on:
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)

            def read() -> tuple[int, int]:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle)
                return int(util.gpu), int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)

        except Exception:  # no NVML: ask nvidia-smi

            def read() -> tuple[int, int]:
                line = subprocess.run(
                    [
                        "nvidia-smi",
                        "--query-gpu=utilization.gpu,memory.used",
                        "--format=csv,noheader,nounits",
                        "-i",
                        "0",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=5,
                    check=True,
                ).stdout.split(",")
                return int(line[0]), int(float(line[1]) * 2**20)

        def loop() -> None:
            while not self._stop.wait(0.05):
                with contextlib.suppress(Exception):
                    gpu, memory = read()
                    self._samples.append(gpu)
                    self._memory.append(memory)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)

    @property
    def utilisation(self) -> float | None:
        """Mean utilisation in % over the samples (None: none taken)."""
        return round(statistics.fmean(self._samples), 1) if self._samples else None

    @property
    def memory_mib(self) -> float | None:
        """The most device memory in use, MiB (None: none taken)."""
        return round(max(self._memory) / 2**20) if self._memory else None


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid``'s main thread (the event loop) and of all its other threads."""
    tick = os.sysconf("SC_CLK_TCK")
    main = other = 0.0
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / tick
            if int(task.name) == pid:
                main += seconds
            else:
                other += seconds
    return main, other


# -- step 0: the models ----------------------------------------------------------------------


def build_large(folder: pathlib.Path, minilm: pathlib.Path, *, dry: bool, device: str) -> None:
    """A random-weight BERT-large-shaped sentence-transformers folder (MiniLM's tokenizer)."""
    import torch
    from transformers import BertConfig, BertModel

    layers, width, heads = (2, 64, 2) if dry else (24, 1024, 16)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = BertModel(config, add_pooling_layer=False)
    model.save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm / name).is_file():
            shutil.copy2(minilm / name, folder / name)
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": width, "pooling_mode_mean_tokens": True})
    )
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 512, "do_lower_case": False})
    )
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ]
        )
    )
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# -- step 1: encode --------------------------------------------------------------------------


def encode_rates(
    model: Model, texts: list[str], dtype: str, device: str, batch_sizes: Sequence[int]
) -> dict[str, Any]:
    """``SentenceTransformer.encode``'s texts/s at each batch size; the best."""
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model.path), device=device, local_files_only=True)
    if dtype != "float32":
        st = st.to(getattr(torch, dtype))
    st.encode(texts[:512], batch_size=64, show_progress_bar=False)  # warm: kernels, allocator
    rates: dict[str, float] = {}
    for bs in batch_sizes:
        sync(device)
        t0 = time.perf_counter()
        st.encode(texts, batch_size=bs, show_progress_bar=False, convert_to_numpy=True)
        sync(device)
        rates[str(bs)] = round(len(texts) / (time.perf_counter() - t0), 1)
    best = max(rates, key=lambda k: rates[k])
    del st
    free(device)
    return {"rates": rates, "best_batch": int(best), "best_per_s": rates[best]}


def sync(device: str) -> None:
    """Wait for the GPU's queued work (nothing on the CPU)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def free(device: str) -> None:
    """Give cached device memory back (between models)."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


# -- step 2: the cost ------------------------------------------------------------------------


def profile(
    model: Model,
    dtype: str,
    device: str,
    texts: list[str],
    workers: int,
    repeats: int,
    *,
    cuda_graphs: bool = False,
) -> dict[str, Any]:
    """The engine's learned sub-pass cost, and a whole call's with ``workers`` at once."""
    from batchserve.engines.embeddings import on_torch
    from batchserve.engines.passes import prior
    from batchserve.engines.runtime import Runtime

    fn = on_torch(
        model.path, Runtime(backend="torch", device=device, dtype=dtype, cuda_graphs=cuda_graphs)
    )
    tokenizer = fn.tokenizer
    words = " ".join(texts).split()
    fn(texts[:64])  # warm
    fit = PassCostModel(PassCost(fixed_s=0.0, per_token_s=0.0), decay=1.0, min_samples=3)
    points = []
    for length in PROFILE_TOKENS[:2] if repeats == 1 else PROFILE_TOKENS:
        text = _text_of(tokenizer, words, length)
        for n in PROFILE_ITEMS[:3] if repeats == 1 else PROFILE_ITEMS:
            batch = [text] * n
            seconds = _timed_calls(fn, batch, workers, repeats, device)
            fit.observe(Shape(1, n * length, n * length * length), seconds)
            points.append({"n": n, "tokens": length, "seconds": round(seconds, 6)})
    learned = fn.statistics()
    start = prior(fn.device, fn.threads)
    out = {
        "prior": _cost(start),
        "engine": {**_cost(learned.cost), "observed": learned.observed},
        "call": _cost(fit.estimate),
        "workers": workers,
        "points": points,
        "cuda_graphs": fn.graphs is not None and fn.graphs.off_reason is None,
    }
    del fn
    free(device)
    return out


def _text_of(tokenizer: Any, words: list[str], tokens: int) -> str:
    """A text of the manual's words that tokenizes to ``tokens`` tokens, specials included."""
    lo, hi = 1, tokens * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer(" ".join(words[:mid]))["input_ids"]) < tokens:
            lo = mid + 1
        else:
            hi = mid
    return " ".join(words[:lo])


def _timed_calls(
    fn: Callable[[list[str]], Any], batch: list[str], workers: int, repeats: int, device: str
) -> float:
    """Wall seconds per call, ``repeats`` calls a thread on ``workers`` threads at once."""
    fn(batch)
    sync(device)
    barrier = threading.Barrier(workers + 1)

    def work() -> None:
        barrier.wait()
        for _ in range(repeats):
            fn(batch)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    sync(device)
    return (time.perf_counter() - t0) / (repeats * workers)


def _cost(cost: PassCost) -> dict[str, float]:
    return {
        "fixed_ms": round(cost.fixed_s * 1e3, 4),
        "per_token_us": round(cost.per_token_s * 1e6, 5),
        "attention_ns": round(cost.attention_s * 1e9, 5),
    }


# -- step 3: served --------------------------------------------------------------------------


@contextlib.contextmanager
def serving(
    model: Model,
    settings: dict[str, int],
    device: str,
    env: dict[str, str],
    *,
    backend: str,
    dtype: str,
    ready_s: float,
) -> Iterator[Server]:
    """``batchserve serve`` of ``model`` on ``device`` with ``settings``, until the block ends."""
    args = [
        "--model",
        f"{model.name}={model.path}",
        "--backend",
        backend,
        "--device",
        device,
        "--dtype",
        dtype,
        "--max-batch-size",
        str(settings["max_batch_size"]),
        "--workers",
        str(settings["workers"]),
        "--max-wait",
        f"{MAX_WAIT_MS}ms",
        "--queue-size",
        str(QUEUE),
        "--timeout",
        f"{DEADLINE_S:g}s",
        "--cuda-graphs",
        "on" if settings.get("cuda_graphs") else "off",
    ]
    server = Server(args, env, ready_timeout_s=ready_s)
    try:
        yield server
    finally:
        server.signal()
        if server.wait_exit(30) is None:
            log(f"the server of {model.name} did not drain in 30 s; killed")
        server.close()


def status(server: Server, name: str) -> dict[str, Any]:
    """The model's entry of ``/status``."""
    res = server.client.get("/status")
    res.raise_for_status()
    entry: dict[str, Any] = res.json()["models"][name]
    return entry


def drive(
    urls: Sequence[str],
    name: str,
    texts_file: pathlib.Path,
    inputs: int,
    rate: float,
    seconds: float,
) -> dict[str, Any]:
    """``batchserve load`` at ``rate`` requests/s, split evenly over ``urls``; summed figures."""
    procs = [
        start_load(
            url,
            {
                "model": name,
                "texts": texts_file,
                "inputs": inputs,
                "rate": f"{rate / len(urls):.1f}",
                "duration": f"{seconds:g}s",
                "timeout": f"{DEADLINE_S:g}s",
                "processes": "auto",
            },
        )
        for url in urls
    ]
    reports = [load_report(proc, seconds + 120) for proc in procs]
    ok = sum(r["ok"] for r in reports)
    sent = sum(r["sent"] for r in reports)
    p50 = statistics.median(r["p50_ms"] for r in reports)
    p99 = max(r["p99_ms"] for r in reports)
    duration = max(r["duration_s"] for r in reports)
    return {
        "offered_per_s": round(rate, 1),
        "sent": sent,
        "ok": ok,
        "ok_requests_per_s": round(ok / duration, 1),
        "ok_texts_per_s": round(ok * inputs / duration, 1),
        "refused_or_late": round(1 - ok / sent, 4) if sent else 0.0,
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "rejected_by_reason": _summed(r.get("rejected_by_reason") for r in reports),
        "timed_out_server": sum(r.get("timed_out_server", 0) for r in reports),
        "timed_out_client": sum(r.get("timed_out_client", 0) for r in reports),
        "errors_by_kind": _summed(r.get("errors_by_kind") for r in reports),
        "generator_warnings": sorted({w for r in reports for w in r.get("warnings", [])}),
    }


def _summed(counts: Iterable[dict[str, int] | None]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in (c or {}).items():
            out[k] = out.get(k, 0) + v
    return out


def measured_load(
    servers: Sequence[Server],
    name: str,
    texts_file: pathlib.Path,
    inputs: int,
    rate: float,
    seconds: float,
    device: str,
) -> dict[str, Any]:
    """One load over ``servers``, with the GPU, the servers' threads and records beside it."""
    before = [status(s, name) for s in servers]
    cpu_before = [thread_cpu_s(s.pid) for s in servers]
    t0 = time.perf_counter()
    with GpuSampler(device) as gpu:
        row = drive([s.url for s in servers], name, texts_file, inputs, rate, seconds)
    wall = time.perf_counter() - t0
    after = [status(s, name) for s in servers]
    cpu_after = [thread_cpu_s(s.pid) for s in servers]
    pairs = list(zip(after, before, strict=True))
    passes = sum(a["batches"]["passes"] - b["batches"]["passes"] for a, b in pairs)
    items = sum(a["batches"]["items"] - b["batches"]["items"] for a, b in pairs)
    loop = max(a[0] - b[0] for a, b in zip(cpu_after, cpu_before, strict=True)) / wall
    other = max(a[1] - b[1] for a, b in zip(cpu_after, cpu_before, strict=True)) / wall
    row.update(
        {
            "mean_pass": round(items / passes, 1) if passes else None,
            "gpu_util_pct": gpu.utilisation,
            "gpu_memory_mib": gpu.memory_mib,
            "loop_cpu_pct": round(loop * 100, 1),
            "workers_cpu_pct": round(other * 100, 1),
            # Each server's CUDA graphs (None: none, its passes ran eagerly).
            "cuda_graphs": [a.get("cuda_graphs") for a in after],
        }
    )
    row["limited_by"] = limit(row)
    return row


def limit(row: dict[str, Any]) -> str:
    """What held a saturated run back, from its figures (a reading, not a proof)."""
    if row["refused_or_late"] < SATURATED_SHARE:
        return "not saturated"
    util = row.get("gpu_util_pct")
    if row["loop_cpu_pct"] >= 85:
        return "the event loop"
    if util is not None and util >= 85:
        return "the GPU"
    if row["workers_cpu_pct"] >= 85:
        return "the workers (tokenizing, launching)"
    return "none of the three saturated"


def saturate(run_at: Callable[[float], dict[str, Any]], start: float) -> dict[str, Any]:
    """Runs at ``start`` and, while nothing is refused or late, at a rate raised."""
    rate = start
    row = run_at(rate)
    for _ in range(RAISES):
        if row["refused_or_late"] >= SATURATED_SHARE:
            break
        rate *= RAISE
        row = run_at(rate)
    return row


def best_of(encode: dict[str, Any], precision: str) -> float:
    """encode's best texts/s at ``precision`` (a ``-mixed`` one: its half type), else float32."""
    figures = encode.get(precision.removesuffix("-mixed")) or encode.get("float32") or {}
    return float(figures.get("best_per_s", 0.0))


def record(
    run: Run,
    row: dict[str, Any],
    model: Model,
    precision: str,
    encode: dict[str, Any],
    *,
    setting: str,
    shape: str,
    load: str,
) -> None:
    """Label a served row, divide it by encode's best at its precision, log it, write it."""
    best = best_of(encode, precision)
    row.update({"model": model.label, "engine": f"torch/{precision}", "setting": setting})
    row.update({"shape": shape, "load": load})
    row["vs_encode"] = round(row["ok_texts_per_s"] / best, 3) if best else None
    run.raw.setdefault("served", []).append(row)
    log(
        f"{model.label} {setting} {shape} {load}: {row['ok_texts_per_s']:.0f} texts/s "
        f"({row['vs_encode']}x encode), p50 {row['p50_ms']} ms, GPU {row['gpu_util_pct']}%, "
        f"loop {row['loop_cpu_pct']}%, workers {row['workers_cpu_pct']}%: {row['limited_by']}"
    )
    write(run)


def serve_model(
    run: Run,
    model: Model,
    encode: dict[str, Any],
    texts_file: pathlib.Path,
    env: dict[str, str],
    seconds: float,
) -> str | None:
    """Step 3 for one model: the tuned settings at both shapes and loads, then the others.

    Returns:
        The precision served (``auto``'s choice for MiniLM); None when nothing was served.
    """
    backend, dtype = ("auto", "auto") if model.auto else ("torch", model.served_dtype)
    ready = max(60.0, min(600.0 if model.auto else 180.0, run.left()))
    guess = max((e["best_per_s"] for e in encode.values()), default=100.0)

    if not run.fits(f"{model.label} served", 25 + 8 * seconds):
        return None
    log(f"{model.label}: serve --backend {backend} --dtype {dtype}")
    with serving(model, TUNED, run.device, env, backend=backend, dtype=dtype, ready_s=ready) as srv:
        entry = status(srv, model.name)
        precision = str(entry["engine"]["precision"])
        choice = entry["engine"].get("choice")
        if choice is not None:
            run.raw.setdefault("auto", {})[model.label] = choice
            write(run)
        setting = _label(TUNED)
        for inputs, shape, share in ((32, "32 a request", 1.1), (1, "1 a request", 0.6)):
            if not run.fits(f"{model.label} {shape}", 4 * seconds):
                continue

            def at(rate: float, inputs: int = inputs) -> dict[str, Any]:
                return measured_load(
                    [srv], model.name, texts_file, inputs, rate, seconds, run.device
                )

            past = saturate(at, max(1.0, share * guess / inputs))
            record(
                run,
                past,
                model,
                precision,
                encode,
                setting=setting,
                shape=shape,
                load="past saturation",
            )
            half = at(max(1.0, 0.5 * past["ok_requests_per_s"]))
            record(
                run,
                half,
                model,
                precision,
                encode,
                setting=setting,
                shape=shape,
                load="half of that",
            )
        end = status(srv, model.name)
        run.raw.setdefault("served_cost", {})[model.label] = {
            "engine_passes": end.get("passes"),
            "policy_tokens": end.get("tokens"),
            "precision": precision,
        }
    return precision


def compare_settings(
    run: Run,
    model: Model,
    precision: str,
    encode: dict[str, Any],
    texts_file: pathlib.Path,
    env: dict[str, str],
    seconds: float,
) -> None:
    """Step 3's other settings: CUDA graphs on, the defaults, the tuned ones with one worker."""
    guess = max((e["best_per_s"] for e in encode.values()), default=100.0)
    others: tuple[tuple[dict[str, int], str, tuple[int, ...]], ...] = (
        ({**TUNED, "cuda_graphs": 1}, f"{_label(TUNED)}, CUDA graphs", (32, 1)),
        (DEFAULTS, "the defaults: batch 32, 1 worker", (32,)),
        ({**TUNED, "workers": 1}, f"batch {TUNED['max_batch_size']}, 1 worker", (32,)),
    )
    for settings, label, shapes in others:
        if not run.fits(f"{model.label} {label}", 20 + 3 * seconds * len(shapes)):
            continue
        with serving(
            model, settings, run.device, env, backend="torch", dtype=precision, ready_s=180
        ) as srv:
            for inputs in shapes:

                def at(rate: float, srv: Server = srv, inputs: int = inputs) -> dict[str, Any]:
                    return measured_load(
                        [srv], model.name, texts_file, inputs, rate, seconds, run.device
                    )

                share = 1.1 if inputs > 1 else 0.6
                past = saturate(at, max(1.0, share * guess / inputs))
                record(
                    run,
                    past,
                    model,
                    precision,
                    encode,
                    setting=label,
                    shape=f"{inputs} a request",
                    load="past saturation",
                )


def _label(settings: dict[str, int]) -> str:
    """A setting's name in the tables: its batch size and workers."""
    return f"batch {settings['max_batch_size']}, {settings['workers']} workers"


def several_servers(
    run: Run,
    model: Model,
    precision: str,
    encode: dict[str, Any],
    texts_file: pathlib.Path,
    env: dict[str, str],
    seconds: float,
) -> None:
    """Step 4: :data:`SERVERS` servers on the one GPU, one text and 32 a request."""
    count = 2 if run.dry else SERVERS
    if not run.fits(f"{model.label} on {count} servers", 40 + 3 * seconds):
        return
    log(f"{model.label}: {count} servers on the one device")
    with contextlib.ExitStack() as stack:
        # Started at once (each loads and warms its engine): the block ends them all.
        with ThreadPoolExecutor(count) as pool:
            futures = [
                pool.submit(
                    stack.enter_context,
                    serving(
                        model, TUNED, run.device, env, backend="torch", dtype=precision, ready_s=180
                    ),
                )
                for _ in range(count)
            ]
            servers = [f.result() for f in futures]
        setting = f"{count} servers, each {_label(TUNED)}"
        for inputs, shape, share in ((1, "1 a request", 0.6), (32, "32 a request", 1.1)):
            if not run.fits(f"{model.label} on {count} servers, {shape}", 3 * seconds):
                continue

            def at(rate: float, inputs: int = inputs) -> dict[str, Any]:
                return measured_load(
                    servers, model.name, texts_file, inputs, rate, seconds, run.device
                )

            guess = share * max(e["best_per_s"] for e in encode.values()) / inputs
            past = saturate(at, max(1.0, guess))
            record(
                run,
                past,
                model,
                precision,
                encode,
                setting=setting,
                shape=shape,
                load="past saturation",
            )


# -- step 5: simulated -----------------------------------------------------------------------


def simulated(
    sizes: list[int],
    cost: PassCost,
    inputs: int,
    rate: float,
    seconds: float,
    settings: dict[str, int],
) -> float:
    """Texts/s the simulator serves of ``rate`` requests/s of ``inputs`` texts each.

    The texts are the load generator's (request ``i`` takes the next ``inputs`` of them);
    one worker, whose pass costs what a call cost with the served workers running at once
    (so the passes the workers overlap are in the cost, not counted twice).
    """
    n = max(1, int(rate * seconds))
    arrivals = [i / rate for i in range(n) for _ in range(inputs)]
    item_sizes = [sizes[(i * inputs + j) % len(sizes)] for i in range(n) for j in range(inputs)]
    result = simulate(
        config=BatchConfig(
            max_batch_size=settings["max_batch_size"],
            max_wait_s=MAX_WAIT_MS / 1e3,
            queue_size=QUEUE,
            workers=1,
        ),
        cost=CostEstimate(fixed_s=0.0, per_item_s=0.0),
        arrivals=arrivals,
        timeout_s=DEADLINE_S,
        duration_s=seconds,
        sizes=item_sizes,
        subpass=cost,
    )
    return float(result.summary.ok_per_s)


def simulate_model(run: Run, model: Model, texts: list[str], seconds: float) -> None:
    """Step 5 for one model: each served 32-a-request row, simulated."""
    from batchserve.models.token_counts import estimate_tokens

    cost_figures = run.raw.get("cost", {}).get(model.label)
    if cost_figures is None:
        return
    call = cost_figures["call"]
    cost = PassCost(
        fixed_s=call["fixed_ms"] / 1e3,
        per_token_s=call["per_token_us"] / 1e6,
        attention_s=call["attention_ns"] / 1e9,
    )
    window = 256 if "MiniLM" in model.label else 512
    sizes = [estimate_tokens(t, window) for t in texts]
    for row in run.raw.get("served", []):
        if row["model"] != model.label or row["shape"] != "32 a request":
            continue
        if row["setting"] != _label(TUNED):
            continue
        predicted = simulated(sizes, cost, 32, row["offered_per_s"], seconds, TUNED)
        run.raw.setdefault("sim", []).append(
            {
                "model": model.label,
                "load": row["load"],
                "offered_texts_per_s": round(row["offered_per_s"] * 32, 1),
                "simulated_texts_per_s": round(predicted, 1),
                "served_texts_per_s": row["ok_texts_per_s"],
                "error": round(predicted / row["ok_texts_per_s"] - 1, 4)
                if row["ok_texts_per_s"]
                else None,
            }
        )
    write(run)


# -- the files -------------------------------------------------------------------------------

#: Each result file's title and columns (the manual's format, docs/benchmarks/index.md).
TABLES: dict[str, tuple[str, list[list[str]]]] = {
    "gpu_encode": (
        "SentenceTransformer.encode in process on the GPU: texts/s at its best batch size",
        [
            ["model", "model", ""],
            ["precision", "precision", ""],
            ["best_batch", "best batch", "d"],
            ["best_per_s", "texts/s", ".0f"],
        ],
    ),
    "gpu_served": (
        "Served on the GPU, open loop, beside encode's best at the same precision",
        [
            ["model", "model", ""],
            ["engine", "engine", ""],
            ["setting", "setting", ""],
            ["shape", "texts", ""],
            ["load", "load", ""],
            ["ok_texts_per_s", "texts/s", ".0f"],
            ["vs_encode", "÷ encode", ".2f"],
            ["p50_ms", "p50 ms", ".1f"],
            ["p99_ms", "p99 ms", ".1f"],
            ["mean_pass", "texts a pass", ".1f"],
            ["graphs", "CUDA graphs", ""],
            ["gpu_util_pct", "GPU busy %", ".0f"],
            ["loop_cpu_pct", "event loop CPU %", ".0f"],
            ["limited_by", "limited by", ""],
        ],
    ),
    "gpu_cost": (
        "A sub-pass's cost on the GPU: the prior, what the engine learned, a whole call",
        [
            ["model", "model", ""],
            ["precision", "precision", ""],
            ["source", "cost", ""],
            ["fixed_ms", "fixed ms", ".3f"],
            ["per_token_us", "µs a token", ".3f"],
            ["attention_ns", "ns a token x length", ".4f"],
        ],
    ),
    "gpu_engines": (
        "backend auto on the GPU: every engine measured and gated (the built-in model)",
        [
            ["engine", "engine", ""],
            ["items_per_s", "texts/s", ".0f"],
            ["vs_fp32", "÷ torch/float32", ".2f"],
            ["mean_cosine", "mean cosine", ".5f"],
            ["min_cosine", "worst cosine", ".5f"],
            ["invariance", "batch invariance", ".6f"],
            ["verdict", "verdict", ""],
        ],
    ),
    "gpu_sim": (
        "The simulator, given the measured cost of a call, beside the served (32 texts a request)",
        [
            ["model", "model", ""],
            ["load", "load", ""],
            ["offered_texts_per_s", "offered texts/s", ".0f"],
            ["simulated_texts_per_s", "simulated", ".0f"],
            ["served_texts_per_s", "served", ".0f"],
            ["error", "error", "+.1%"],
        ],
    ),
}


def rows_of(run: Run, name: str) -> list[dict[str, Any]]:
    """The rows of one result file, from what the run measured."""
    raw = run.raw
    if name == "gpu_encode":
        return [
            {"model": m, "precision": d, **{k: v for k, v in e.items() if k != "rates"}}
            for m, by in raw.get("encode", {}).items()
            for d, e in by.items()
        ]
    if name == "gpu_served":
        return [{**r, "graphs": _graphs_cell(r.get("cuda_graphs"))} for r in raw.get("served", [])]
    if name == "gpu_cost":
        return _cost_rows(raw)
    if name == "gpu_engines":
        return _engine_rows(raw)
    return list(raw.get("sim", []))


def _graphs_cell(stats: list[dict[str, Any] | None] | None) -> str:
    """What the servers' CUDA graphs did during a load (empty: the passes ran eagerly)."""
    live = [s for s in stats or [] if s]
    if not live:
        return ""
    if any(s.get("off") for s in live):
        return "turned off: " + str(next(s["off"] for s in live if s.get("off")))[:80]
    captured = sum(s["captured"] for s in live)
    replayed = sum(s["replayed"] for s in live)
    return f"{captured} captured, {replayed} replays"


def _cost_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """gpu_cost's rows: the prior, the engine's learned cost, a call's, the served one."""
    out = []
    profiled = [*raw.get("cost", {}).items(), *raw.get("cost_graphs", {}).items()]
    for m, c in profiled:
        how = "replayed as CUDA graphs" if c.get("cuda_graphs") else "eager"
        for source, key in (
            ("the prior", "prior"),
            (f"learned by the engine (forward), {how}", "engine"),
            (f"a whole call, {c['workers']} at once (tokenizing included), {how}", "call"),
        ):
            if key == "prior" and how != "eager":
                continue
            out.append({"model": m, "precision": c["precision"], "source": source, **c[key]})
    for m, served in raw.get("served_cost", {}).items():
        passes = served.get("engine_passes") or {}
        if passes.get("cost"):
            out.append(
                {
                    "model": m,
                    "precision": served.get("precision"),
                    "source": "learned by the engine while served (the tuned settings)",
                    **_cost(PassCost(**passes["cost"])),
                }
            )
    return out


def _engine_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """gpu_engines's rows: MiniLM's verdict on the GPU, a trial a row."""
    choice = raw.get("auto", {}).get("all-MiniLM-L6-v2")
    if not choice:
        return []
    trials = choice["trials"]
    ref = next((t for t in trials if (t["backend"], t["precision"]) == REF), None)
    base = ref.get("items_per_s") if ref else None
    served = (choice["chosen"]["backend"], choice["chosen"]["precision"])
    out = []
    for t in trials:
        quality = t.get("quality") or {}
        rate = t.get("items_per_s")
        key = (t["backend"], t["precision"])
        invariance = t.get("invariance")
        if invariance is None:
            invariance = quality.get("invariance")
        out.append(
            {
                "engine": f"{key[0]}/{key[1]}",
                "items_per_s": rate,
                "vs_fp32": round(rate / base, 3) if rate and base else None,
                "mean_cosine": quality.get("mean_cosine"),
                "min_cosine": quality.get("min_cosine"),
                "invariance": invariance,
                "verdict": "served" if key == served else _gate_word(t),
            }
        )
    return out


def _gate_word(trial: dict[str, Any]) -> str:
    if trial.get("unavailable"):
        return str(trial["unavailable"])
    if trial.get("items_per_s") is None:
        return "not run"
    gated = trial.get("gated")
    if gated is None:
        return "not gated (not faster than torch/float32, or one before it passed)"
    return "passed the gate" if gated else "failed the gate"


def write(run: Run, *, raw_too: bool = True) -> None:
    """Every file, from what the run measured so far (the raw one too, unless not)."""
    run.out.mkdir(parents=True, exist_ok=True)
    date = run.date
    for name, (title, columns) in TABLES.items():
        rows = rows_of(run, name)
        if not rows:
            continue
        data = {
            "title": title,
            "command": run.command,
            "machine": run.machine,
            "date": date,
            "columns": columns,
            "rows": rows,
            "note": NOTE,
            "skipped": run.skipped,
        }
        (run.out / f"{name}.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    if not raw_too:
        return
    raw = {
        **run.raw,
        "command": run.command,
        "machine": run.machine,
        "date": date,
        "skipped": run.skipped,
        "note": NOTE,
    }
    (run.out / "gpu_raw.json").write_text(json.dumps(raw, indent=1, ensure_ascii=False) + "\n")


NOTE = (
    "all-MiniLM-L6-v2's weights travel to the GPU machine as a float16 copy and are cast back "
    "to float32 there (bench/gpu/carry.py): every figure, the CPU reference included, is "
    "measured on those; BERT-large is random weights of its shape"
)


def table(run: Run) -> str:
    """The short table printed last."""
    lines = [f"machine: {run.machine}"]
    for name, e in sorted(run.raw.get("encode", {}).items()):
        for dtype, figures in e.items():
            lines.append(
                f"encode  {name:22} {dtype:9} best {figures['best_per_s']:9.0f} texts/s "
                f"at batch {figures['best_batch']}"
            )
    lines.append(
        f"{'served':7} {'model':22} {'setting':34} {'texts':13} {'load':16} "
        f"{'texts/s':>8} {'÷enc':>5} {'p50':>6} {'GPU%':>5} {'loop%':>5}  limited by"
    )
    for r in run.raw.get("served", []):
        lines.append(
            f"{'':7} {r['model']:22} {r['setting'][:34]:34} {r['shape']:13} {r['load']:16} "
            f"{r['ok_texts_per_s']:8.0f} {r['vs_encode'] or 0:5.2f} {r['p50_ms']:6.1f} "
            f"{r['gpu_util_pct'] if r['gpu_util_pct'] is not None else '-':>5} "
            f"{r['loop_cpu_pct']:5.0f}  {r['limited_by']}"
        )
    for r in run.raw.get("sim", []):
        lines.append(
            f"sim     {r['model']:22} {r['load']:16} simulated {r['simulated_texts_per_s']:8.0f}"
            f" served {r['served_texts_per_s']:8.0f} ({(r['error'] or 0) * 100:+.1f}%)"
        )
    for m, c in run.raw.get("cost", {}).items():
        for key in ("prior", "engine", "call"):
            f = c[key]
            lines.append(
                f"cost    {m:22} {key:7} {f['fixed_ms']:8.3f} ms + "
                f"{f['per_token_us']:8.4f} us/token + {f['attention_ns']:8.5f} ns/token x length"
            )
    lines += [f"skipped: {s}" for s in run.skipped]
    return "\n".join(lines)


# -- the run ---------------------------------------------------------------------------------


def _command(args: argparse.Namespace) -> str:
    """This run's command line, as the manual's result files name it (no --out)."""
    parts = ["python bench/gpu/measure.py", f"--budget {args.budget:g}", f"--models {args.models}"]
    if args.only != ",".join(STEPS):
        parts.append(f"--only {args.only}")
    if args.previous:
        parts.append(f"--previous {args.previous}")
    if args.dry_run:
        parts.append("--dry-run")
    return " ".join(parts)


def merge(raws: Sequence[pathlib.Path], out: pathlib.Path) -> int:
    """The result files of several runs (``--merge``): served rows together, else the first's."""
    runs = [json.loads(p.read_text()) for p in raws]
    merged: dict[str, Any] = {"served": []}
    for raw in runs:
        merged["served"] += raw.get("served", [])
        for key in ("encode", "cost", "cost_graphs", "auto", "served_cost"):
            for name, value in raw.get(key, {}).items():
                merged.setdefault(key, {}).setdefault(name, value)
        if "sim" not in merged and raw.get("sim"):
            merged["sim"] = raw["sim"]
    run = Run(
        out=out,
        budget_end=0.0,
        dry=False,
        device="cuda",
        machine=runs[0]["machine"],
        command=", then ".join(str(r["command"]) for r in runs),
        raw=merged,
        # A step a run skipped, a later run may have measured: only the last run's stand.
        skipped=list(runs[-1].get("skipped", [])),
        date=str(runs[0]["date"]),
    )
    write(run, raw_too=False)  # the raw figures are the runs' own files
    print(table(run), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "out" / "gpu")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds the run may take")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each load")
    ap.add_argument("--models", default="minilm,large", help="minilm, large or both")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, tiny: checks the script")
    ap.add_argument(
        "--only",
        default=",".join(STEPS),
        help=f"the steps to run, of {','.join(STEPS)} (default: all)",
    )
    ap.add_argument(
        "--merge",
        type=pathlib.Path,
        nargs="+",
        metavar="RAW",
        help="write the result files from these runs' gpu_raw.json instead of measuring: "
        "their served rows together, the rest from the first run that has it",
    )
    ap.add_argument(
        "--previous",
        type=pathlib.Path,
        help="a gpu_raw.json whose encode rates and served precisions stand in for the "
        "steps --only leaves out",
    )
    args = ap.parse_args(argv)
    steps = set(args.only.split(","))
    if steps - set(STEPS):
        ap.error(f"--only takes steps of {','.join(STEPS)}, got {args.only!r}")
    previous: dict[str, Any] = json.loads(args.previous.read_text()) if args.previous else {}
    if args.merge:
        return merge(args.merge, args.out)
    import torch

    from batchserve.engines.embeddings import builtin_path

    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    if not dry and not torch.cuda.is_available():
        print(
            "measure: no CUDA device here (torch.cuda.is_available() is False); "
            "use --dry-run to check the script on the CPU",
            file=sys.stderr,
        )
        return 2
    seconds = 1.0 if dry else args.seconds
    run = Run(
        out=args.out,
        budget_end=time.monotonic() + args.budget,
        dry=dry,
        device=device,
        machine=describe_machine(device),
        command=_command(args),
    )
    log(f"machine: {run.machine}")
    work = pathlib.Path(tempfile.mkdtemp(prefix="batchserve-gpu-"))
    paragraphs = list(reference_paragraphs())
    texts_file = work / "paragraphs.txt"
    texts_file.write_text("\n".join(paragraphs) + "\n")
    minilm = builtin_path()
    models = []
    wanted = args.models.split(",")
    if "minilm" in wanted:
        models.append(
            Model(
                name="all-MiniLM-L6-v2",
                label="all-MiniLM-L6-v2",
                path=minilm,
                served_dtype="float32" if dry else "float16",
                # A dry run on the CPU would time every CPU engine (minutes): torch alone.
                auto=not dry,
                texts=256 if dry else 4 * len(paragraphs),
                several=True,
            )
        )
    if "large" in wanted:
        large = work / "bert-large-random"
        build_large(large, minilm, dry=dry, device=device)
        models.append(
            Model(
                name="bert-large",
                label="BERT-large shape (random)",
                path=large,
                served_dtype="float32" if dry else "float16",
                auto=False,
                texts=256 if dry else len(paragraphs),
            )
        )
    env = {"BATCHSERVE_CACHE_DIR": str(work / "cache"), "HF_HUB_OFFLINE": "1"}
    served: dict[str, str] = {}
    try:
        for model in models:
            texts = (paragraphs * 4)[: model.texts]
            if dry:
                precisions = ["float32"]
            elif model.auto:  # auto may choose any: encode at each (-mixed: its half type)
                precisions = ["float32", "float16", "bfloat16"]
            else:
                precisions = ["float32", model.served_dtype]
            encode: dict[str, Any] = run.raw.setdefault("encode", {}).setdefault(model.label, {})
            if "encode" not in steps:
                encode.update(previous.get("encode", {}).get(model.label, {}))
                precisions = []
            for dtype in precisions:
                if run.fits(f"{model.label} encode {dtype}", 20):
                    log(f"{model.label}: encode at {dtype}")
                    encode[dtype] = encode_rates(
                        model, texts, dtype, device, BATCH_SIZES[:2] if dry else BATCH_SIZES
                    )
                    write(run)
            precision = None
            if "served" in steps:
                precision = serve_model(run, model, encode, texts_file, env, seconds)
            elif model.label in previous.get("auto", {}):
                precision = previous["auto"][model.label]["chosen"]["precision"]
            precision = precision or ("float32" if dry else model.served_dtype)
            if "cost" in steps and run.fits(f"{model.label} cost", 20):
                log(f"{model.label}: the cost of a pass at {precision}")
                cost = profile(
                    model, precision, device, paragraphs, TUNED["workers"], 1 if dry else 3
                )
                run.raw.setdefault("cost", {})[model.label] = {**cost, "precision": precision}
                write(run)
                if not dry and run.fits(f"{model.label} cost with CUDA graphs", 20):
                    graphed = profile(
                        model, precision, device, paragraphs, TUNED["workers"], 3, cuda_graphs=True
                    )
                    run.raw.setdefault("cost_graphs", {})[model.label] = {
                        **graphed,
                        "precision": precision,
                    }
                    write(run)
            if "sim" in steps:
                simulate_model(run, model, paragraphs, seconds)
            served[model.label] = precision
        # What fits after both models' own rows: MiniLM over several servers, then the
        # other settings of each.
        for model in models:
            if model.several and "several" in steps:
                encode = run.raw["encode"][model.label]
                several_servers(run, model, served[model.label], encode, texts_file, env, seconds)
        for model in models if "settings" in steps else ():
            compare_settings(
                run,
                model,
                served[model.label],
                run.raw["encode"][model.label],
                texts_file,
                env,
                seconds,
            )
    finally:
        write(run)
        shutil.rmtree(work, ignore_errors=True)
    print(table(run), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
