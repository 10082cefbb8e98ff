"""The quantizer against sentence-transformers' ``quantize_embeddings``: the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

from batchserve.models.quantize import PRECISIONS, Calibration, quantize, ranges_of

st_quantization = pytest.importorskip("sentence_transformers.util.quantization")


def _data(dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    calibration = rng.normal(size=(150, dim)).astype(np.float32)
    calibration[:, 0] = 0.25  # a dimension of no range: its step is read as 1
    vectors = (rng.normal(size=(11, dim)) * 1.5).astype(np.float32)  # some beyond the range
    vectors[0, :4] = 0.0  # exactly zero: not > 0, so a clear bit
    return calibration, vectors


@pytest.mark.parametrize("dim", [8, 37, 384])
@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_every_type_is_byte_equal_to_quantize_embeddings(dim: int, precision: str) -> None:
    calibration, vectors = _data(dim)
    expected = st_quantization.quantize_embeddings(
        vectors, precision, calibration_embeddings=calibration
    )
    got = quantize(vectors, precision, ranges_of(calibration))  # type: ignore[arg-type]
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


def test_float_is_the_vectors_and_the_types_are_cohere_s() -> None:
    _, vectors = _data(8)
    assert quantize(vectors, "float").tobytes() == vectors.tobytes()
    assert PRECISIONS == ("float", "int8", "uint8", "binary", "ubinary")


def test_int8_needs_ranges_of_the_vectors_width() -> None:
    calibration, vectors = _data(8)
    with pytest.raises(ValueError, match="calibration ranges"):
        quantize(vectors, "int8")
    with pytest.raises(ValueError, match="calibration ranges"):
        quantize(vectors[:, :4], "int8", ranges_of(calibration))


def test_a_calibration_computes_each_transform_s_ranges_once() -> None:
    calibration, _ = _data(16)
    cal = Calibration.of(calibration, "test")
    calls = []

    def half(rows: np.ndarray) -> np.ndarray:
        calls.append(1)
        return rows[:, :8]

    assert np.array_equal(cal.ranges(), ranges_of(calibration))
    first = cal.ranges("half", half)
    assert cal.ranges("half", half) is first
    assert len(calls) == 1
    assert np.array_equal(first, ranges_of(calibration[:, :8]))
    with pytest.raises(ValueError, match="rows of vectors"):
        Calibration.of(np.zeros((0, 4)), "empty")
