"""The machine's facts and what they make possible, for machines this one is not.

Every rule is a pure function of a :class:`Machine`, so an AMD EPYC with AVX2 only, a Xeon
with VNNI, one with AMX and a GPU without bfloat16 are all checked here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batchserve.engines.hardware import (
    REFERENCE,
    Engine,
    Machine,
    _read_cpuinfo,
    candidates,
    precision_support,
)
from batchserve.engines.runtime import Runtime, resolve_dtype
from batchserve.errors import ConfigError

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})
EPYC = Machine(cpu_model="AMD EPYC", cpu_flags=AVX2, cores=2)
VNNI = Machine(
    cpu_model="Intel Xeon (Cascade Lake)",
    cpu_flags=AVX2 | {"avx512f", "avx512bw", "avx512_vnni"},
    cores=2,
)
AMX = Machine(
    cpu_model="Intel Xeon (Sapphire Rapids)",
    cpu_flags=AVX2 | {"avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"},
    cores=2,
)
ALL = {"torch", "onnx", "onnx-int8", "openvino", "openvino-int8"}


def offered(machine: Machine, device: str = "cpu", installed: set[str] = ALL) -> list[str]:
    return [str(c.engine) for c in candidates(machine, device, installed) if not c.unavailable]


def test_what_a_cpu_computes_in_comes_from_its_flags() -> None:
    assert (EPYC.cpu_bf16, EPYC.int8_dot, EPYC.cpu_fp16) == (False, False, False)
    assert (VNNI.cpu_bf16, VNNI.int8_dot) == (False, True)
    assert (AMX.cpu_bf16, AMX.int8_dot) == (True, True)
    assert Machine(cpu_flags=frozenset({"avx512_bf16"})).cpu_bf16
    assert Machine(cpu_flags=frozenset({"avx_vnni"})).int8_dot
    assert "bf16" in AMX.describe()
    assert "AVX2" in EPYC.describe()
    assert "bf16" not in EPYC.describe()


def test_the_identity_changes_with_what_matters_to_speed_only() -> None:
    assert EPYC.identity() == Machine(cpu_model="AMD EPYC", cpu_flags=AVX2, cores=2).identity()
    assert EPYC.identity() != Machine(cpu_model="AMD EPYC", cpu_flags=AVX2, cores=4).identity()
    assert EPYC.identity() != VNNI.identity()
    # a flag that does not matter to a model's speed does not change it
    noisy = Machine(cpu_model="AMD EPYC", cpu_flags=AVX2 | {"rdrand"}, cores=2)
    assert noisy.identity() == EPYC.identity()
    assert EPYC.to_dict()["cpu_flags"] == ["avx2", "f16c", "fma"]


def test_cpuinfo_is_read_for_the_model_and_the_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n"
    )
    assert _read_cpuinfo(str(info)) == ("AMD EPYC 7B13", frozenset({"fpu", "avx2", "fma"}))
    assert _read_cpuinfo(str(tmp_path / "missing"))[1] == frozenset()


@pytest.mark.parametrize(
    ("dtype", "device", "machine", "reason"),
    [
        ("float32", "cpu", EPYC, None),
        ("int8", "cpu", EPYC, None),
        ("bfloat16", "cpu", EPYC, "needs AVX-512 BF16 or AMX, which this CPU (AMD EPYC) lacks"),
        ("bfloat16-mixed", "cpu", VNNI, "needs AVX-512 BF16 or AMX"),
        ("bfloat16", "cpu", AMX, None),
        ("bfloat16-mixed", "cpu", AMX, None),
        ("float16", "cpu", AMX, "needs AVX-512 FP16 or AMX-FP16"),
        ("float16", "cuda:0", EPYC, None),
        ("bfloat16", "cuda:0", EPYC, "does not compute in bfloat16"),
        ("bfloat16", "cuda:0", Machine(cuda_devices=("H100",), cuda_bf16=True), None),
        ("float16", "mps", EPYC, None),
        ("bfloat16", "mps", EPYC, "not offered on mps"),
    ],
)
def test_precision_support(dtype: str, device: str, machine: Machine, reason: str | None) -> None:
    got = precision_support(dtype, device, machine)
    if reason is None:
        assert got is None
    else:
        assert got is not None
        assert reason in got


def test_a_cpu_without_bf16_is_offered_no_bf16_engine() -> None:
    assert offered(EPYC) == [
        "torch/float32",
        "onnx/float32",
        "onnx-int8/int8",
        "openvino/float32",
        "openvino-int8/int8",
    ]
    assert offered(VNNI) == offered(EPYC)
    refused = {str(c.engine): c.unavailable for c in candidates(EPYC, "cpu", ALL)}
    assert "lacks" in (refused["torch/bfloat16"] or "")
    assert "lacks" in (refused["openvino/bfloat16"] or "")


def test_a_cpu_with_amx_is_offered_bf16_on_torch_both_ways_and_openvino() -> None:
    assert offered(AMX) == [
        "torch/float32",
        "torch/bfloat16",
        "torch/bfloat16-mixed",
        "onnx/float32",
        "onnx-int8/int8",
        "openvino/float32",
        "openvino/bfloat16",
        "openvino-int8/int8",
    ]


def test_a_gpu_runs_torch_at_each_half_precision_it_computes_in() -> None:
    h100 = Machine(cpu_flags=AVX2, cuda_devices=("H100",), cuda_bf16=True)
    t4 = Machine(cpu_flags=AVX2, cuda_devices=("T4",), cuda_bf16=False)
    assert offered(h100, "cuda:0") == [
        "torch/float32",
        "torch/bfloat16",
        "torch/bfloat16-mixed",
        "torch/float16",
        "torch/float16-mixed",
    ]
    assert offered(t4, "cuda:0") == ["torch/float32", "torch/float16", "torch/float16-mixed"]
    reasons = {str(c.engine): c.unavailable for c in candidates(t4, "cuda:0", ALL)}
    assert reasons["onnx-int8/int8"] == "onnx-int8 runs on the CPU here, not on cuda:0"
    assert offered(EPYC, "mps") == ["torch/float32", "torch/float16"]


def test_a_missing_package_is_named_with_its_extra() -> None:
    reasons = {str(c.engine): c.unavailable for c in candidates(EPYC, "cpu", {"torch"})}
    assert reasons["torch/float32"] is None
    assert reasons["onnx-int8/int8"] == "not installed: pip install 'batchserve[onnx]'"
    assert reasons["openvino/float32"] == "not installed: pip install 'batchserve[openvino]'"


def test_a_precision_given_keeps_auto_to_it() -> None:
    got = [str(c.engine) for c in candidates(AMX, "cpu", ALL, dtype="int8")]
    assert got == ["onnx-int8/int8", "openvino-int8/int8"]
    assert candidates(AMX, "cpu", ALL)[0].engine == REFERENCE
    assert Engine.parse("openvino/bfloat16") == Engine("openvino", "bfloat16")


def test_resolve_dtype_follows_the_machine_not_a_belief() -> None:
    # bfloat16 on a CPU that computes in it is served as asked
    assert resolve_dtype("bfloat16", device="cpu", requested_device="cpu", machine=AMX) == (
        "bfloat16"
    )
    with pytest.raises(ConfigError, match=r"dtype 'bfloat16' on device 'cpu': bfloat16 on the"):
        resolve_dtype("bfloat16", device="cpu", requested_device="cpu", machine=EPYC)
    # auto found no GPU: the same config falls back to float32 on such a CPU
    assert resolve_dtype("bfloat16", device="cpu", requested_device="auto", machine=EPYC) == (
        "float32"
    )
    # OpenVINO's own default precision, made explicit: bf16 where the CPU computes in it
    assert resolve_dtype("auto", device="cpu", requested_device="auto", backend="openvino") == (
        "float32"
    )
    assert (
        resolve_dtype(
            "auto", device="cpu", requested_device="auto", backend="openvino", machine=AMX
        )
        == "bfloat16"
    )
    assert resolve_dtype("auto", device="cpu", requested_device="cpu", backend="onnx-int8") == (
        "int8"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "onnx", "dtype": "bfloat16"}, "dtype bfloat16 is not a precision of backend"),
        ({"backend": "onnx-int8", "dtype": "float32"}, "it runs int8 \\(or auto\\)"),
        ({"backend": "torch", "dtype": "int8"}, "dtype int8 is not a precision of backend torch"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
    ],
)
def test_each_backend_takes_its_own_precisions(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Runtime(**fields)  # type: ignore[arg-type]
    assert Runtime(backend="openvino", dtype="bfloat16").dtype == "bfloat16"
    assert Runtime(backend="auto", dtype="int8").exported is False
