"""Runtime settings: validation, device and precision resolution, default threads.

Device resolution is a pure function of the machine's facts, so every rule is checked here
for machines this one is not (several GPUs, Apple's mps, none).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batchserve.engines.hardware import Machine
from batchserve.engines.runtime import (
    Runtime,
    default_cache_dir,
    default_threads,
    default_workers,
    resolve_device,
    resolve_dtype,
)
from batchserve.errors import ConfigError


def test_defaults_measure_every_engine_on_the_best_device() -> None:
    rt = Runtime()
    assert (rt.backend, rt.device, rt.dtype, rt.threads, rt.exported, rt.batch_size) == (
        "auto",
        "auto",
        "auto",
        None,
        False,
        None,
    )
    assert Runtime(backend="onnx-int8").exported
    assert not Runtime(backend="torch").exported


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "tensorrt"}, "backend must be one of auto, torch, onnx, onnx-int8"),
        ({"device": "gpu"}, "device must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"),
        ({"device": "cuda:x"}, "device must be"),
        ({"dtype": "float64"}, "dtype must be one of auto, float32, float16, bfloat16"),
        ({"threads": 0}, "threads must be an integer >= 1, got 0"),
        ({"threads": True}, "threads must be an integer >= 1"),
        ({"cache_dir": ""}, "cache_dir must be a non-empty path"),
        ({"backend": "onnx", "dtype": "float16"}, "dtype float16 is not a precision of backend"),
    ],
)
def test_a_bad_setting_names_the_field_the_rule_and_the_value(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Runtime(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("requested", "cuda", "mps", "expected"),
    [
        ("auto", 0, False, "cpu"),
        ("auto", 2, False, "cuda:0"),
        ("auto", 0, True, "mps"),
        ("auto", 1, True, "cuda:0"),
        ("cpu", 4, True, "cpu"),
        ("cuda", 1, False, "cuda:0"),
        ("cuda:1", 2, False, "cuda:1"),
        ("mps", 0, True, "mps"),
    ],
)
def test_resolve_device(requested: str, cuda: int, mps: bool, expected: str) -> None:
    assert resolve_device(requested, cuda_devices=cuda, mps=mps) == expected


@pytest.mark.parametrize(
    ("requested", "cuda", "mps", "message"),
    [
        ("cuda", 0, False, "device 'cuda': no CUDA device is available here"),
        ("cuda:2", 2, False, r"CUDA devices here are cuda:0..cuda:1"),
        ("mps", 1, False, "no Apple Metal device"),
    ],
)
def test_a_device_that_is_not_here_is_refused_with_what_is(
    requested: str, cuda: int, mps: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_device(requested, cuda_devices=cuda, mps=mps)


def test_exported_backends_run_on_the_cpu() -> None:
    assert resolve_device("auto", cuda_devices=1, mps=True, backend="onnx") == "cpu"
    assert resolve_device("cpu", cuda_devices=1, mps=False, backend="openvino") == "cpu"
    with pytest.raises(ConfigError, match="backend onnx-int8 runs on the CPU here"):
        resolve_device("cuda", cuda_devices=1, mps=False, backend="onnx-int8")


def test_half_precision_where_the_machine_computes_in_it() -> None:
    gpu = Machine(cuda_devices=("A100",), cuda_bf16=True)
    assert resolve_dtype("bfloat16", device="cuda:0", requested_device="auto", machine=gpu) == (
        "bfloat16"
    )
    assert resolve_dtype("float16", device="mps", requested_device="mps") == "float16"
    # auto found no GPU: the same config runs float32 on a CPU without float16
    assert resolve_dtype("float16", device="cpu", requested_device="auto") == "float32"
    with pytest.raises(ConfigError, match="float16 on the CPU needs AVX-512 FP16 or AMX-FP16"):
        resolve_dtype("float16", device="cpu", requested_device="cpu")
    # auto is float32 for torch, on any device (the measurement picks half precision)
    assert resolve_dtype("auto", device="cuda:0", requested_device="auto", machine=gpu) == (
        "float32"
    )


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (4, 3), (8, 6), (64, 62)])
def test_default_threads_leave_the_event_loop_a_core(cores: int, threads: int) -> None:
    assert default_threads(cores) == threads


@pytest.mark.parametrize(
    ("device", "threads", "cores", "workers"),
    [
        ("cpu", 1, 2, 2),  # the default threads on two cores: two one-thread passes
        ("cpu", 2, 2, 1),
        ("cpu", 3, 4, 1),
        ("cpu", 1, 4, 4),
        ("cpu", 6, 8, 1),
        ("cpu", 4, 2, 1),  # more threads than cores: still one pass
        ("cpu", 1, 1, 1),
        ("cuda:0", 1, 16, 2),  # one prepares a pass while the other's runs on the device
        ("mps", 1, 8, 2),
    ],
)
def test_default_workers_fill_the_cores_with_passes(
    device: str, threads: int, cores: int, workers: int
) -> None:
    assert default_workers(device, threads, cores) == workers


def test_default_cache_dir(tmp_path: Path) -> None:
    assert default_cache_dir({"BATCHSERVE_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert default_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/batchserve")
    assert default_cache_dir({}).parts[-2:] == (".cache", "batchserve")
    assert Runtime(cache_dir=str(tmp_path)).cache_path() == tmp_path
