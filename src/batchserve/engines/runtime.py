"""Where and how the built-in embedding model runs: backend, device, precision, CPU threads.

Theory of operation: a :class:`Runtime` is what the user asked for (``--backend``,
``--device``, ``--dtype``, ``--threads``, ``--cache-dir``), validated when it is built.
What it means on this machine is decided once, at load, by pure functions that are handed
the machine's facts instead of probing it themselves, so that every rule is testable
without a GPU:

* :func:`resolve_device`: ``auto`` picks the first CUDA GPU, else Apple's ``mps``, else
  the CPU; ``cuda`` means ``cuda:0``; asking for a device that is not there is an error
  that says what is.
* :func:`resolve_dtype`: the precision a backend runs at on the resolved device. ``auto``
  is float32 for torch and ONNX Runtime, int8 for the ``-int8`` backends, and for
  OpenVINO what the CPU computes in (bfloat16 with AVX-512 BF16 or AMX, else float32, as
  OpenVINO itself would). Half precision is possible where the machine's facts say so
  (:func:`~batchserve.engines.hardware.precision_support`: a GPU, or a CPU with bfloat16
  instructions); asked for by name where it is not, it is an error that names the missing
  instructions; under ``--device auto`` it falls back to float32, so one config serves
  both kinds of machine.
* ``--backend auto`` (the default) is not resolved here: the engine is chosen by
  measuring every possible one (:mod:`batchserve.engines.choice`).
* :func:`default_threads`: the CPU threads one forward pass uses. The server's event loop
  (HTTP parsing, batching, answering) needs a share of a core while passes run, so the
  default leaves it room on a small machine; see the function for the measurement.
* :func:`default_workers`: the forward passes run at once when none are set. On the CPU,
  as many as the cores hold passes of that many threads (two one-thread passes on two
  cores); on a GPU, two (one prepares a pass while the other's runs).

ONNX Runtime and OpenVINO run on the CPU here (their GPU builds are other packages), so
their ``auto`` is the CPU and an explicit GPU device is refused with the reason.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from batchserve.engines.hardware import Machine, precision_support
from batchserve.errors import ConfigError

__all__ = [
    "BACKENDS",
    "BACKEND_DTYPES",
    "DTYPES",
    "Runtime",
    "default_cache_dir",
    "default_threads",
    "default_workers",
    "place_exported",
    "place_torch",
    "resolve_device",
    "resolve_dtype",
]

#: The backends of the built-in model: ``auto`` (measured, see :mod:`batchserve.engines.choice`),
#: PyTorch, ONNX Runtime, OpenVINO; full precision or int8.
BACKENDS = ("auto", "torch", "onnx", "onnx-int8", "openvino", "openvino-int8")
#: Precisions. ``-mixed`` is torch's autocast (float32 weights, products in half precision);
#: ``auto`` lets the backend's rule (or, under backend ``auto``, the measurement) decide.
DTYPES = ("auto", "float32", "float16", "bfloat16", "float16-mixed", "bfloat16-mixed", "int8")
#: The precisions each backend runs at (``auto`` is every one of them).
BACKEND_DTYPES: dict[str, tuple[str, ...]] = {
    "auto": DTYPES[1:],
    "torch": ("float32", "float16", "bfloat16", "float16-mixed", "bfloat16-mixed"),
    "onnx": ("float32",),
    "onnx-int8": ("int8",),
    "openvino": ("float32", "bfloat16"),
    "openvino-int8": ("int8",),
}
#: Where exported models are cached when neither ``--cache-dir`` nor this variable says.
CACHE_ENV = "BATCHSERVE_CACHE_DIR"

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    """How to run an embedding model.

    Attributes:
        backend: one of :data:`BACKENDS`; ``auto`` measures every engine the machine
            offers and serves the fastest that passes the quality gate.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        dtype: one of :data:`DTYPES`, among the backend's (:data:`BACKEND_DTYPES`).
        threads: CPU threads per forward pass; None takes :func:`default_threads`.
        cache_dir: where exported ONNX/OpenVINO files and the ``auto`` verdicts live;
            None takes :func:`default_cache_dir`.
        batch_size: the batch size ``auto`` measures the engines at (the model's
            ``max_batch_size``); None is 32.
        cuda_graphs: on a CUDA GPU, replay a torch engine's passes as CUDA graphs, one a
            shape bucket (:mod:`batchserve.engines.cuda_graphs`; a model whose capture
            fails or differs runs eagerly, logged); no effect elsewhere. Off by default
            until a served measurement shows the gain (the module says what was measured).
        trust_remote_code: run the code a model folder ships (``auto_map`` in its
            ``config.json``): what transformers' and sentence-transformers'
            ``trust_remote_code`` says. Off, such a folder is refused at start
            (:meth:`batchserve.models.kinds.FolderKind.check`).
        pooling: ``splade`` serves a bare ``...ForMaskedLM`` folder as a SPLADE sparse
            embedder (:func:`batchserve.models.kinds.splade_kind`); None reads the pooling
            from the folder.
    """

    backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    cache_dir: str | None = None
    batch_size: int | None = None
    cuda_graphs: bool = False
    trust_remote_code: bool = False
    pooling: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.device, str) or not _DEVICE.match(self.device):
            raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ConfigError(f"threads must be an integer >= 1, got {self.threads!r}")
        if self.cache_dir is not None and not self.cache_dir:
            raise ConfigError("cache_dir must be a non-empty path when given, got ''")
        if self.batch_size is not None and (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or self.batch_size < 1
        ):
            raise ConfigError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if self.pooling not in (None, "splade"):
            raise ConfigError(f"pooling must be splade, got {self.pooling!r}")
        if not isinstance(self.cuda_graphs, bool):
            raise ConfigError(f"cuda_graphs must be on or off, got {self.cuda_graphs!r}")
        if not isinstance(self.trust_remote_code, bool):
            raise ConfigError(
                f"trust_remote_code must be a boolean, got {self.trust_remote_code!r}"
            )
        allowed = BACKEND_DTYPES[self.backend]
        if self.dtype != "auto" and self.dtype not in allowed:
            raise ConfigError(
                f"dtype {self.dtype} is not a precision of backend {self.backend}: it runs "
                f"{', '.join(allowed)} (or auto), got dtype {self.dtype!r}"
            )

    @property
    def exported(self) -> bool:
        """Whether the backend runs a file exported from the torch weights."""
        return self.backend not in ("torch", "auto")

    def cache_path(self) -> Path:
        """The cache folder this runtime uses."""
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


def default_cache_dir(environ: dict[str, str] | None = None) -> Path:
    """The cache folder for exports.

    ``$BATCHSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/batchserve``, else
    ``~/.cache/batchserve``.
    """
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "batchserve"


def resolve_device(requested: str, *, cuda_devices: int, mps: bool, backend: str = "torch") -> str:
    """The concrete device for ``requested`` on a machine with these devices.

    Args:
        requested: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        cuda_devices: how many CUDA GPUs the backend can use.
        mps: whether Apple's Metal device is available to the backend.
        backend: the backend; only torch runs on a GPU here.

    Returns:
        ``cpu``, ``cuda:N`` or ``mps``.

    Raises:
        ConfigError: the device is not there (the message says which are), or the backend
            cannot use it.
    """
    if requested == "cpu":
        return "cpu"
    if backend not in ("torch", "auto"):
        if requested == "auto":
            return "cpu"
        raise ConfigError(
            f"device {requested!r}: backend {backend} runs on the CPU here (its GPU build is "
            "another package); use --device cpu or auto, or --backend torch"
        )
    if requested == "auto":
        if cuda_devices > 0:
            return "cuda:0"
        return "mps" if mps else "cpu"
    if requested == "mps":
        if not mps:
            raise ConfigError("device 'mps': no Apple Metal device is available here")
        return "mps"
    index = int(requested.partition(":")[2] or 0)
    if cuda_devices == 0:
        raise ConfigError(f"device {requested!r}: no CUDA device is available here")
    if index >= cuda_devices:
        raise ConfigError(
            f"device {requested!r}: CUDA devices here are cuda:0..cuda:{cuda_devices - 1}"
        )
    return f"cuda:{index}"


def resolve_dtype(
    dtype: str,
    *,
    device: str,
    requested_device: str,
    backend: str = "torch",
    machine: Machine | None = None,
) -> str:
    """The precision ``backend`` runs at on ``device`` (the resolved one).

    ``auto`` is float32 (int8 for an ``-int8`` backend; for OpenVINO, bfloat16 where the
    CPU computes in it). A precision the machine cannot compute in (see
    :func:`~batchserve.engines.hardware.precision_support`) is refused when the device was
    asked for by name, and falls back to float32 when ``auto`` found no device for it.

    Args:
        dtype: the precision asked for (one of :data:`DTYPES`).
        device: the resolved device.
        requested_device: the device asked for (``auto`` allows the fallback).
        backend: the backend (not ``auto``).
        machine: the facts; None is a machine with no bfloat16 or float16 on its CPU.

    Raises:
        ConfigError: a precision the machine cannot compute in, asked for by name.
    """
    facts = machine or Machine()
    if dtype == "auto":
        if backend.endswith("-int8"):
            return "int8"
        if backend == "openvino" and device == "cpu" and facts.cpu_bf16:
            return "bfloat16"
        return "float32"
    reason = precision_support(dtype, device, facts)
    if reason is None:
        return dtype
    if requested_device == "auto":
        return "float32"
    raise ConfigError(f"dtype {dtype!r} on device {device!r}: {reason}; use float32 or int8")


def usable_cores() -> int:
    """The cores this process may run on (its affinity; the CPU count off Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads(cpu_count: int | None = None) -> int:
    """CPU threads per forward pass when none are set.

    All cores but one on a machine of up to four cores, so that the event loop keeps one;
    all but two above that. Measured on the 2-core machine this project is developed on
    (``batchserve profile --backend all --threads 1`` and ``--threads 2``, served with
    ``bench/models/minilm_throughput.py``): see the README section "The built-in model: devices,
    backends, int8".

    Args:
        cpu_count: cores usable by this process; None reads them (``os.sched_getaffinity``).
    """
    if cpu_count is None:
        cpu_count = usable_cores()
    if cpu_count <= 4:
        return max(1, cpu_count - 1)
    return cpu_count - 2


def default_workers(device: str, threads: int, cpu_count: int | None = None) -> int:
    """Forward passes at once (the batcher's ``workers``) when none are set.

    On a GPU or ``mps``, two: a pass's CPU side (tokenizing its texts, issuing its kernels,
    copying the vectors back) is as long as its GPU side or longer for an encoder, so one
    worker prepares the next pass while the other's runs on the device (the passes' GPU
    work still runs one after the other on the device's stream). Measured on an H200 with
    ``bench/gpu/measure.py``: two workers served the built-in model's 32-text requests at
    about twice the rate of one (``docs/results/gpu_served.json``). On the CPU, as many
    passes of ``threads`` threads as the cores hold, at least one: with the default threads
    that is two one-thread passes on two cores, and one pass elsewhere. Two one-thread
    passes beat one two-thread pass on a busy machine: a pass whose threads must meet at
    every layer stalls whenever anything else takes a core, while two independent passes
    each just slow down. Measured here with ``bench/models/minilm_throughput.py`` (see the
    README section "The built-in model: devices, backends, int8"); the event loop shares
    the cores, and its share is small beside a forward pass.

    Args:
        device: where the passes run (``cpu``, ``cuda:N``, ``mps``).
        threads: CPU threads per pass.
        cpu_count: cores usable by this process; None reads them (``os.sched_getaffinity``).
    """
    if device != "cpu":
        return 2
    if cpu_count is None:
        cpu_count = usable_cores()
    return max(1, cpu_count // max(1, threads))


def place_torch(runtime: Runtime) -> tuple[str, str]:
    """Where a torch model of ``runtime`` runs here, and at what precision.

    Resolves the device (:func:`resolve_device`, from what torch sees) and the precision
    (:func:`resolve_dtype`, from the machine's facts), and on the CPU sets torch's threads
    (process-wide) to the runtime's (:func:`default_threads` when unset). The caller has
    imported torch already (and said which extra it needs if it could not).

    Returns:
        The device (``cpu``, ``cuda:N``, ``mps``) and the precision.

    Raises:
        ConfigError: the device or the precision is not to be had here.
    """
    import torch

    mps = getattr(torch.backends, "mps", None)
    device = resolve_device(
        runtime.device,
        cuda_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        mps=bool(mps is not None and mps.is_available()),
    )
    machine = Machine.here(gpus=False) if device == "cpu" else Machine.here()
    dtype = resolve_dtype(
        runtime.dtype, device=device, requested_device=runtime.device, machine=machine
    )
    if device == "cpu":
        torch.set_num_threads(runtime.threads or default_threads())
    return device, dtype


def place_exported(runtime: Runtime) -> str:
    """The precision an exported engine (ONNX Runtime, OpenVINO) of ``runtime`` runs at.

    Both run on the CPU only: a GPU asked for by name is refused. ``auto`` is the backend's
    rule (:func:`resolve_dtype`: bfloat16 for OpenVINO where the CPU computes in it).

    Raises:
        ConfigError: the device or the precision is not to be had here.
    """
    resolve_device(runtime.device, cuda_devices=0, mps=False, backend=runtime.backend)
    return resolve_dtype(
        runtime.dtype,
        device="cpu",
        requested_device=runtime.device,
        backend=runtime.backend,
        machine=Machine.here(gpus=False),
    )
