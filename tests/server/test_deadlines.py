"""A request's deadline from the wire: each header's rule, the tightest wins, from arrival."""

from __future__ import annotations

import time

import pytest

from batchserve.server.deadlines import wire_deadline
from batchserve.server.statuses import ApiError


def test_no_header_sets_no_deadline() -> None:
    assert wire_deadline({}, 10.0, 10.5) is None


@pytest.mark.parametrize(
    ("name", "value", "seconds"),
    [
        (b"x-request-timeout", b"0.25", 0.25),
        (b"x-request-timeout", b"250ms", 0.25),
        (b"grpc-timeout", b"250m", 0.25),
        (b"grpc-timeout", b"2S", 2.0),
        (b"grpc-timeout", b"1M", 60.0),
        (b"grpc-timeout", b"1H", 3600.0),
        (b"grpc-timeout", b"250000u", 0.25),
        (b"grpc-timeout", b"25000000n", 0.025),
        (b"x-envoy-expected-rq-timeout-ms", b"250", 0.25),
    ],
)
def test_relative_headers_count_from_the_arrival(name: bytes, value: bytes, seconds: float) -> None:
    # Arrived at 10.0, read at 10.5: the deadline counts from the first byte.
    assert wire_deadline({name: value}, 10.0, 10.5) == pytest.approx(10.0 + seconds)


def test_an_absolute_deadline_is_converted_to_the_monotonic_clock() -> None:
    epoch = time.time() + 2.0
    got = wire_deadline({b"x-request-deadline": b"%.6f" % epoch}, 100.0, 100.5)
    assert got == pytest.approx(102.5, abs=0.05)


def test_the_tightest_header_wins() -> None:
    head = {
        b"x-request-timeout": b"5s",
        b"grpc-timeout": b"300m",
        b"x-envoy-expected-rq-timeout-ms": b"2000",
    }
    assert wire_deadline(head, 1.0, 1.0) == pytest.approx(1.3)


def test_envoy_zero_means_no_timeout() -> None:
    assert wire_deadline({b"x-envoy-expected-rq-timeout-ms": b"0"}, 1.0, 1.0) is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (b"x-request-timeout", b"soon"),
        (b"x-request-timeout", b"0"),
        (b"x-request-deadline", b"tomorrow"),
        (b"x-request-deadline", b"inf"),
        (b"grpc-timeout", b"5Q"),
        (b"grpc-timeout", b"123456789S"),
        (b"x-envoy-expected-rq-timeout-ms", b"-1"),
        (b"x-envoy-expected-rq-timeout-ms", b"1.5"),
    ],
)
def test_a_broken_value_is_422_naming_its_header(name: bytes, value: bytes) -> None:
    with pytest.raises(ApiError) as info:
        wire_deadline({name: value}, 1.0, 1.0)
    assert info.value.status == 422
    assert info.value.param is not None
    assert info.value.param.lower() == name.decode()
    assert value.decode() in info.value.message
