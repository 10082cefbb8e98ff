"""Where a GPU pass's time goes: launches, the BLAS library, tokenizing, a CUDA graph.

    python bench/gpu/diagnose.py --out DIR [--dry-run]

``measure.py`` found the served passes on a GPU machine bound by the CPU's side of the
pass. This script takes one pass apart, in process, for the built-in model (float32 and
float16) and the random BERT-large shape (float16), on the manual's paragraphs:

1. **eager**: one forward of ``n`` texts padded to ``L`` tokens (inputs already on the
   device): the wall time a forward takes from the CPU, and the GPU's own time of the same
   forward (CUDA events) -- their gap is what issuing the kernels costs;
2. **profile**: ``torch.profiler`` over one forward: how many kernels it launches, the CPU
   time that costs per launch, and the operators that cost the CPU most;
3. **variants**: the same forward with cuBLAS instead of cuBLASLt for half precision
   (``torch.backends.cuda.preferred_blas_library``), and with TF32 matrix products for
   float32;
4. **graph**: the transformer captured once as a CUDA graph at that shape (a 4-D mask, so
   the mask is not prepared at each call) and replayed: its time, and the cosine of its
   pooled vectors to the eager ones;
5. **tokenizing**: the model's fast tokenizer on 256 paragraphs, per token.

Writes ``DIR/gpu_diagnose_raw.json`` (every figure, rewritten after each step) and
``DIR/gpu_diagnose.json`` (the manual's result file: a row a model, precision and shape),
and prints a short table. ``--render RAW`` writes the result file again from a raw one.
``--dry-run`` runs it on the CPU (no events, graphs or profiler's CUDA figures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from batchserve.loadgen.texts import reference_paragraphs

SHAPES = ((1, 16), (32, 64), (256, 64))


def _inputs(tokenizer: Any, texts: list[str], n: int, length: int, device: str) -> dict[str, Any]:
    import torch

    batch = [texts[i % len(texts)] for i in range(n)]
    enc = tokenizer(
        batch, padding="max_length", truncation=True, max_length=length, return_tensors="pt"
    )
    out = {k: v.to(device) for k, v in enc.items()}
    if "token_type_ids" not in out:
        out["token_type_ids"] = torch.zeros_like(out["input_ids"])
    return out


def _pool(hidden: Any, mask: Any) -> Any:
    import torch

    m = mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * m).sum(dim=1)
    return torch.nn.functional.normalize(summed / m.sum(dim=1).clamp(min=1e-9), dim=-1)


def _time(fn: Callable[[], Any], device: str, repeats: int = 10) -> tuple[float, float | None]:
    """Median wall ms (synchronised) and median GPU ms (CUDA events) of ``fn``."""
    import torch

    cuda = device.startswith("cuda")
    for _ in range(3):
        fn()
    if cuda:
        torch.cuda.synchronize()
    walls, gpus = [], []
    for _ in range(repeats):
        if cuda:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
        t0 = time.perf_counter()
        fn()
        if cuda:
            end.record()
            torch.cuda.synchronize()
            gpus.append(start.elapsed_time(end))
        walls.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(walls), (statistics.median(gpus) if gpus else None)


def _profile(fn: Callable[[], Any], device: str) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    fn()
    with profile(activities=activities) as prof:
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    events = prof.key_averages()
    launches = [
        e for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
    ]
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    return {
        "launches": sum(e.count for e in launches),
        "launch_cpu_us_each": round(
            sum(e.self_cpu_time_total for e in launches) / max(1, sum(e.count for e in launches)), 2
        ),
        "self_cpu_ms": round(sum(e.self_cpu_time_total for e in events) / 1e3, 3),
        "top_self_cpu": [
            {"op": e.key, "calls": e.count, "self_cpu_us": round(e.self_cpu_time_total, 1)}
            for e in top
        ],
    }


def _graph(model: Any, inputs: dict[str, Any], eager: Any, device: str) -> dict[str, Any]:
    """Capture ``model`` with a 4-D mask at this shape, replay it; its time and cosine."""
    import torch

    mask2d = inputs["attention_mask"]
    n, length = mask2d.shape
    mask4d = mask2d[:, None, None, :].bool().expand(n, 1, length, length).contiguous()
    static = {
        "input_ids": inputs["input_ids"].clone(),
        "token_type_ids": inputs["token_type_ids"].clone(),
        "attention_mask": mask4d,
    }

    def run() -> Any:
        return model(**static).last_hidden_state

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    with torch.inference_mode(), torch.cuda.graph(graph):
        out = run()
    capture_ms = (time.perf_counter() - t0) * 1e3
    with torch.inference_mode():
        wall, gpu = _time(graph.replay, device)
        pooled = _pool(out, mask2d).float()
        cos = torch.nn.functional.cosine_similarity(pooled, eager.float(), dim=-1)
    return {
        "capture_ms": round(capture_ms, 2),
        "replay_wall_ms": round(wall, 3),
        "replay_gpu_ms": None if gpu is None else round(gpu, 3),
        "min_cosine_to_eager": round(float(cos.min()), 7),
    }


def diagnose(
    label: str,
    path: pathlib.Path,
    dtype: str,
    device: str,
    texts: list[str],
    out: dict[str, Any],
    write: Callable[[], None],
) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModel.from_pretrained(str(path), local_files_only=True).to(device).eval()
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    rows = out.setdefault("models", []).copy()
    for n, length in SHAPES:
        row: dict[str, Any] = {"model": label, "precision": dtype, "n": n, "tokens": length}
        inputs = _inputs(tokenizer, texts, n, length, device)

        def forward(inputs: dict[str, Any] = inputs) -> Any:
            with torch.inference_mode():
                return model(**inputs).last_hidden_state

        try:
            wall, gpu = _time(forward, device)
            row.update(
                {
                    "eager_wall_ms": round(wall, 3),
                    "eager_gpu_ms": None if gpu is None else round(gpu, 3),
                }
            )
            with torch.inference_mode():
                eager = _pool(forward(), inputs["attention_mask"])
            if (n, length) == (32, 64):
                row["profile"] = _profile(forward, device)
            if (n, length) == (256, 64) and device.startswith("cuda"):
                for name, setup, undo in _variants(dtype):
                    setup()
                    try:
                        row[name] = round(_time(forward, device)[0], 3)
                    finally:
                        undo()
            if device.startswith("cuda") and n > 1:
                try:
                    row["graph"] = _graph(model, inputs, eager, device)
                except Exception as exc:  # what stops a capture is the finding
                    row["graph"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
        out["models"] = rows
        write()
        brief = {k: v for k, v in row.items() if k != "profile"}
        print(
            f"{label} {dtype} n={n} L={length}: {json.dumps(brief)}",
            file=sys.stderr,
            flush=True,
        )
    if device.startswith("cuda"):  # the model goes with this frame; its memory with it
        torch.cuda.empty_cache()


def _variants(dtype: str) -> list[tuple[str, Callable[[], None], Callable[[], None]]]:
    import torch

    if dtype == "float32":

        def tf32_on() -> None:
            torch.backends.cuda.matmul.allow_tf32 = True

        def tf32_off() -> None:
            torch.backends.cuda.matmul.allow_tf32 = False

        return [("tf32_wall_ms", tf32_on, tf32_off)]
    before = torch.backends.cuda.preferred_blas_library()

    def cublas() -> None:
        torch.backends.cuda.preferred_blas_library("cublas")

    def restore() -> None:
        torch.backends.cuda.preferred_blas_library(before)

    return [("cublas_wall_ms", cublas, restore)]


def tokenizing(path: pathlib.Path, texts: list[str]) -> dict[str, Any]:
    """The fast tokenizer on 256 paragraphs: ms, and us per token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    batch = texts[:256]
    tokenizer(batch, padding=True, truncation=True, max_length=256, return_tensors="pt")
    t0 = time.perf_counter()
    for _ in range(5):
        enc = tokenizer(batch, padding=True, truncation=True, max_length=256, return_tensors="pt")
    ms = (time.perf_counter() - t0) * 1e3 / 5
    tokens = int(enc["attention_mask"].sum())
    return {
        "texts": len(batch),
        "tokens": tokens,
        "ms": round(ms, 3),
        "us_per_token": round(ms * 1e3 / tokens, 4),
    }


#: The result file's columns (the manual's format, docs/benchmarks/index.md).
COLUMNS = [
    ["model", "model", ""],
    ["precision", "precision", ""],
    ["shape", "texts x tokens", ""],
    ["eager_wall_ms", "eager ms", ".2f"],
    ["graph_ms", "CUDA graph ms", ".2f"],
    ["speedup", "÷", ".1f"],
    ["graph_cosine", "graph's worst cosine", ".7f"],
    ["launches", "kernels", "d"],
    ["launch_us", "CPU µs a launch", ".1f"],
    ["variant_ms", "TF32 / cuBLAS ms", ".2f"],
]


def result(raw: dict[str, Any]) -> dict[str, Any]:
    """The manual's result file of a raw diagnosis: a row a model, precision and shape."""
    rows = []
    for r in raw.get("models", []):
        graph = r.get("graph") or {}
        profile = r.get("profile") or {}
        replay = graph.get("replay_wall_ms")
        eager = r.get("eager_wall_ms")
        rows.append(
            {
                "model": r["model"],
                "precision": r["precision"],
                "shape": f"{r['n']} x {r['tokens']}",
                "eager_wall_ms": eager,
                "graph_ms": replay,
                "speedup": round(eager / replay, 2) if eager and replay else None,
                "graph_cosine": graph.get("min_cosine_to_eager"),
                "launches": profile.get("launches"),
                "launch_us": profile.get("launch_cpu_us_each"),
                "variant_ms": r.get("tf32_wall_ms", r.get("cublas_wall_ms")),
            }
        )
    tok = raw.get("tokenizing") or {}
    return {
        "title": "One pass on the GPU taken apart: eager against its CUDA graph, the kernels "
        "it launches and what a launch costs the CPU, TF32 (float32) or cuBLAS (half "
        "precision) instead of the default",
        "command": raw.get("command", "python bench/gpu/diagnose.py"),
        "machine": raw["machine"],
        "date": raw.get("date", ""),
        "columns": COLUMNS,
        "rows": rows,
        "note": (
            f"the fast tokenizer on {tok.get('texts')} paragraphs: {tok.get('ms')} ms, "
            f"{tok.get('us_per_token')} us a token, on the same machine"
            if tok
            else ""
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/out/gpu"))
    ap.add_argument("--dry-run", action="store_true", help="on the CPU: checks the script")
    ap.add_argument("--render", type=pathlib.Path, help="a gpu_diagnose_raw.json to render")
    args = ap.parse_args(argv)
    if args.render:
        raw = json.loads(args.render.read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_diagnose.json").write_text(json.dumps(result(raw), indent=1) + "\n")
        return 0
    import torch
    from measure import build_large, describe_machine  # this script's neighbour

    from batchserve.engines.embeddings import builtin_path

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("diagnose: no CUDA device here; use --dry-run", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "machine": describe_machine(device),
        "command": "python bench/gpu/diagnose.py" + (" --dry-run" if args.dry_run else ""),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }

    def write() -> None:
        (args.out / "gpu_diagnose_raw.json").write_text(json.dumps(out, indent=1) + "\n")
        (args.out / "gpu_diagnose.json").write_text(json.dumps(result(out), indent=1) + "\n")

    texts = list(reference_paragraphs())
    minilm = builtin_path()
    out["tokenizing"] = tokenizing(minilm, texts)
    write()
    with tempfile.TemporaryDirectory() as work:
        large = pathlib.Path(work) / "bert-large-random"
        build_large(large, minilm, dry=args.dry_run, device=device)
        plan = [
            ("all-MiniLM-L6-v2", minilm, "float32"),
            ("all-MiniLM-L6-v2", minilm, "float16"),
            ("BERT-large shape (random)", large, "float16"),
        ]
        if args.dry_run:
            plan = [p for p in plan if p[2] == "float32"] + [
                ("BERT-large shape (random)", large, "float32")
            ]
        for label, path, dtype in plan:
            with contextlib.suppress(Exception):
                diagnose(label, path, dtype, device, texts, out, write)
    write()
    print(f"tokenizing: {out['tokenizing']}")
    for r in out.get("models", []):
        g = r.get("graph") or {}
        p = r.get("profile") or {}
        print(
            f"{r['model'][:22]:22} {r['precision']:8} n={r['n']:3} L={r['tokens']:3} eager wall "
            f"{r.get('eager_wall_ms')} ms gpu {r.get('eager_gpu_ms')} ms; graph "
            f"{g.get('replay_wall_ms', g.get('error'))} cos {g.get('min_cosine_to_eager')}; "
            f"launches {p.get('launches')} at {p.get('launch_cpu_us_each')} us; "
            f"tf32 {r.get('tf32_wall_ms')} cublas {r.get('cublas_wall_ms')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
