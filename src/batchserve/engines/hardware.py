"""The machine's facts, and what they make possible: which engine runs at which precision.

Theory of operation: what a machine can do is read once (:meth:`Machine.here`: the CPU's
model name and flags from ``/proc/cpuinfo``, its usable cores, the GPUs torch sees) into a
frozen :class:`Machine`, and every rule below is a pure function of that value, so each is
tested with made-up machines (an AMD EPYC with AVX2 only, a Xeon with AVX-512 VNNI, one
with AMX, a GPU without bfloat16) on whatever machine runs the tests.

What is *possible* is decided here, from facts; what is *fastest* is never decided here:
it is measured (:mod:`batchserve.engines.choice`). The rules:

* **bfloat16 on the CPU** needs the instructions that compute in it: AVX-512 BF16
  (``avx512_bf16``) or AMX (``amx_bf16``). Without them torch and OpenVINO emulate it,
  converting every value, which is slower than float32.
* **float16 on the CPU** needs AVX-512 FP16 or AMX-FP16 (``avx512_fp16``, ``amx_fp16``).
* **GPUs** run float16 everywhere, bfloat16 where the device supports it (compute
  capability 8.0 and up: ``cuda_bf16``); Apple's ``mps`` runs float16.
* **int8** is possible on every CPU (ONNX Runtime and OpenVINO have AVX2 kernels); VNNI or
  AMX (``int8_dot``) make it several times cheaper, and the measurement says by how much.

:func:`candidates` lists every engine (backend and precision) the machine and the
installed packages could serve, each with the reason when it cannot.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "REFERENCE",
    "Candidate",
    "Engine",
    "Machine",
    "candidates",
    "installed_backends",
    "precision_support",
]

#: CPU flags that matter to a model's speed; a machine's identity is keyed on these.
RELEVANT_FLAGS = frozenset(
    {
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
        "avx_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_bf16",
        "amx_int8",
        "amx_fp16",
        "amx_tile",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """What this machine has, as far as running a model goes.

    Attributes:
        cpu_model: the CPU's model name (``/proc/cpuinfo``'s ``model name``).
        cpu_flags: the CPU's feature flags, as Linux names them (``avx512_bf16``, ...).
        cores: cores this process may use.
        cuda_devices: the name of each CUDA GPU torch sees, in order.
        cuda_bf16: whether the first CUDA GPU computes in bfloat16 (capability >= 8.0).
        mps: whether Apple's Metal device is available.
    """

    cpu_model: str = "unknown"
    cpu_flags: frozenset[str] = frozenset()
    cores: int = 1
    cuda_devices: tuple[str, ...] = ()
    cuda_bf16: bool = False
    mps: bool = False

    @property
    def cpu_bf16(self) -> bool:
        """Whether the CPU computes in bfloat16 (AVX-512 BF16 or AMX)."""
        return bool({"avx512_bf16", "amx_bf16"} & self.cpu_flags)

    @property
    def cpu_fp16(self) -> bool:
        """Whether the CPU computes in float16 (AVX-512 FP16 or AMX-FP16)."""
        return bool({"avx512_fp16", "amx_fp16"} & self.cpu_flags)

    @property
    def int8_dot(self) -> bool:
        """Whether the CPU has int8 dot-product instructions (VNNI or AMX)."""
        return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & self.cpu_flags)

    def describe(self) -> str:
        """One line: the CPU, what it computes in, the cores, the GPUs."""
        extras = [
            name
            for name, has in (
                ("bf16", self.cpu_bf16),
                ("fp16", self.cpu_fp16),
                ("int8 dot (VNNI/AMX)", self.int8_dot),
                ("AVX-512", "avx512f" in self.cpu_flags),
                ("AVX2", "avx2" in self.cpu_flags),
            )
            if has
        ]
        gpus = f", GPUs: {', '.join(self.cuda_devices)}" if self.cuda_devices else ""
        mps = ", mps" if self.mps else ""
        return (
            f"{self.cpu_model} ({', '.join(extras) or 'no vector extensions'}), "
            f"{self.cores} cores{gpus}{mps}"
        )

    def identity(self) -> str:
        """A short hex digest of the facts a measurement depends on (for cache keys)."""
        text = "|".join(
            [
                self.cpu_model,
                ",".join(sorted(self.cpu_flags & RELEVANT_FLAGS)),
                str(self.cores),
                ",".join(self.cuda_devices),
                str(self.mps),
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, object]:
        """The facts as JSON-ready values (flags: only those that matter to speed)."""
        return {
            "cpu_model": self.cpu_model,
            "cpu_flags": sorted(self.cpu_flags & RELEVANT_FLAGS),
            "cores": self.cores,
            "cuda_devices": list(self.cuda_devices),
            "cuda_bf16": self.cuda_bf16,
            "mps": self.mps,
            "identity": self.identity(),
        }

    @classmethod
    def here(cls, *, gpus: bool = True) -> Machine:
        """Read this machine's facts.

        Args:
            gpus: ask torch for its GPUs (imports torch when it is installed); False
                reports none, for the CPU-only engines.
        """
        model, flags = _read_cpuinfo()
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        cuda: tuple[str, ...] = ()
        cuda_bf16 = mps = False
        if gpus and importlib.util.find_spec("torch") is not None:
            import torch

            if torch.cuda.is_available():
                cuda = tuple(
                    torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
                )
                cuda_bf16 = bool(torch.cuda.is_bf16_supported())
            backend = getattr(torch.backends, "mps", None)
            mps = bool(backend is not None and backend.is_available())
        return cls(
            cpu_model=model,
            cpu_flags=flags,
            cores=cores,
            cuda_devices=cuda,
            cuda_bf16=cuda_bf16,
            mps=mps,
        )


def _read_cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    model, flags = "unknown", frozenset[str]()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown":
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
                if model != "unknown" and flags:
                    break
    except OSError:  # not Linux: no flags known, so no CPU precision beyond float32
        import platform

        model = platform.processor() or platform.machine() or "unknown"
    return model, flags


@dataclass(frozen=True, slots=True, order=True)
class Engine:
    """A way to run the model: a backend at a precision.

    Attributes:
        backend: ``torch``, ``onnx``, ``onnx-int8``, ``openvino`` or ``openvino-int8``.
        dtype: ``float32``, ``float16``, ``bfloat16``, ``float16-mixed``,
            ``bfloat16-mixed`` (torch's autocast: float32 weights, matrix products in
            half precision) or ``int8``.
    """

    backend: str
    dtype: str

    def __str__(self) -> str:
        return f"{self.backend}/{self.dtype}"

    @classmethod
    def parse(cls, text: str) -> Engine:
        """Read ``backend/dtype`` back (what ``str`` wrote)."""
        backend, _, dtype = text.partition("/")
        return cls(backend, dtype)


#: The reference every other engine is measured and gated against.
REFERENCE = Engine("torch", "float32")


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """An engine, and why it cannot run here (None when it can)."""

    engine: Engine
    unavailable: str | None = None


def precision_support(dtype: str, device: str, machine: Machine) -> str | None:
    """Why ``dtype`` cannot run on ``device`` of ``machine``; None when it can.

    Args:
        dtype: a precision (``-mixed`` variants are judged by their half type).
        device: ``cpu``, ``cuda:N`` or ``mps`` (resolved).
        machine: the facts.
    """
    half = dtype.removesuffix("-mixed")
    if half in ("float32", "int8"):
        return None
    if device == "cpu":
        if half == "bfloat16" and not machine.cpu_bf16:
            return (
                f"bfloat16 on the CPU needs AVX-512 BF16 or AMX, which this CPU "
                f"({machine.cpu_model}) lacks: it would be emulated, slower than float32"
            )
        if half == "float16" and not machine.cpu_fp16:
            return (
                f"float16 on the CPU needs AVX-512 FP16 or AMX-FP16, which this CPU "
                f"({machine.cpu_model}) lacks: it would be emulated, slower than float32"
            )
        return None
    if device == "mps":
        return "bfloat16 is not offered on mps; use float16" if half == "bfloat16" else None
    if half == "bfloat16" and not machine.cuda_bf16:
        return "this GPU does not compute in bfloat16 (compute capability below 8.0)"
    return None


def installed_backends() -> set[str]:
    """The backends whose packages are importable here (not imported)."""

    def has(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module blocked or half-imported
            return False

    found = {"torch"} if has("sentence_transformers") else set()
    if has("onnxruntime") and has("onnx"):
        found |= {"onnx", "onnx-int8"}
    if has("openvino") and has("onnx"):
        found.add("openvino")
        if has("nncf"):
            found.add("openvino-int8")
    return found


_TORCH_DTYPES = ("float32", "bfloat16", "bfloat16-mixed", "float16", "float16-mixed")


def candidates(
    machine: Machine,
    device: str,
    installed: Iterable[str],
    *,
    dtype: str = "auto",
) -> list[Candidate]:
    """Every engine that could serve on ``device``, each with the reason if it cannot here.

    Args:
        machine: the facts.
        device: the resolved device (``cpu``, ``cuda:N``, ``mps``); ONNX Runtime and
            OpenVINO run on the CPU only (their GPU builds are other packages).
        installed: the backends whose packages are installed (:func:`installed_backends`).
        dtype: ``auto`` (every precision) or one precision to keep to.

    Returns:
        The engines in a fixed order, the reference (torch float32) first.
    """
    have = set(installed)
    engines = [Engine("torch", d) for d in _TORCH_DTYPES]
    engines += [
        Engine("onnx", "float32"),
        Engine("onnx-int8", "int8"),
        Engine("openvino", "float32"),
        Engine("openvino", "bfloat16"),
        Engine("openvino-int8", "int8"),
    ]
    out = []
    for engine in engines:
        if dtype != "auto" and engine.dtype != dtype:
            continue
        reason = None
        if engine.backend not in have:
            extra = "onnx" if engine.backend.startswith("onnx") else "openvino"
            reason = f"not installed: pip install 'batchserve[{extra}]'"
        elif engine.backend != "torch" and device != "cpu":
            reason = f"{engine.backend} runs on the CPU here, not on {device}"
        else:
            reason = precision_support(engine.dtype, device, machine)
            if reason is None and device == "mps" and engine.dtype.endswith("-mixed"):
                reason = "autocast is not offered on mps"
        out.append(Candidate(engine=engine, unavailable=reason))
    return out
