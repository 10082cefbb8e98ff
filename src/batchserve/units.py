"""Durations with units and lists of rates, for the CLI and config files.

Durations: ``2ms``, ``0.25s``, ``250us``, ``1m``. Rates (requests per second): ``600``,
``200,400,600`` or a range ``START:STOP:STEP`` (STOP included). The Python API takes float
seconds and floats per second; only the outer skins (CLI, config files, HTTP headers) parse
text, through :func:`parse_duration` and :func:`parse_rates`.
"""

from __future__ import annotations

import math
import re

from batchserve.errors import ConfigError

__all__ = [
    "POSITIVE_DURATION_PATTERN",
    "format_duration",
    "parse_duration",
    "parse_int_range",
    "parse_rates",
]

_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zµ]*)\s*$")

#: The grammar of a duration > 0 as a JSON Schema pattern, for documents that state it (the
#: OpenAPI description of the deadline header): a number with a non-zero digit, then one of
#: the units above or none. :func:`parse_duration` also reads exponents and spaces.
POSITIVE_DURATION_PATTERN = (
    r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]*\.[0-9]*[1-9][0-9]*)"
    + "("
    + "|".join(sorted(_UNITS, key=len, reverse=True))
    + ")?$"
)


def parse_duration(text: str, *, name: str = "duration", default_unit: str | None = None) -> float:
    """Parse ``text`` such as ``2ms`` or ``0.25s`` into float seconds.

    Args:
        text: a non-negative number followed by a unit (us, ms, s, m, h).
        name: the parameter's name, for the error message.
        default_unit: the unit of a bare number; None means a unit is required.

    Raises:
        ConfigError: the text is not a duration; the message names ``name`` and the rule.
    """
    match = _PATTERN.match(text)
    unit = match.group(2) if match else ""
    if not unit and default_unit is not None:
        unit = default_unit
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"{name} must be a duration with a unit (us, ms, s, m, h), such as 2ms or 0.25s, "
            f"got {text!r}"
        )
    value = float(match.group(1)) * _UNITS[unit]
    if math.isinf(value):
        raise ConfigError(f"{name} must be finite, got {text!r}")
    return value


def format_duration(seconds: float) -> str:
    """Format seconds compactly with a unit: ``0.002`` -> ``2ms``."""
    if seconds == 0:
        return "0s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:g}us"
    if seconds < 1:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds:g}s"


def parse_rates(text: str, *, name: str = "rates") -> list[float]:
    """Parse ``600``, ``200,400,600`` or ``START:STOP:STEP`` (STOP included) into rates.

    Raises:
        ConfigError: an item is not a finite number > 0, a range is not increasing with a
            step > 0, or nothing is listed; the message names ``name`` and the rule.
    """
    rule = f"{name} must be a rate > 0, a comma-separated list or START:STOP:STEP"
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if not (step > 0 and stop >= start):
                raise ConfigError(f"{rule} with STEP > 0 and STOP >= START, got {text!r}")
            rates = [start + i * step for i in range(int((stop - start) / step + 1e-9) + 1)]
        else:
            rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{rule}, got {text!r}") from None
    if not rates or not all(0 < r < math.inf for r in rates):
        raise ConfigError(f"{rule}, got {text!r}")
    return rates


def parse_int_range(text: str, *, name: str = "range") -> tuple[int, int]:
    """``N`` (as ``N:N``) or ``LOW:HIGH``: positive integers, both ends included.

    Raises:
        ConfigError: not a positive integer or a range of them; the message names ``name``.
    """
    low_text, sep, high_text = text.partition(":")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        raise ConfigError(f"{name} must be N or LOW:HIGH, got {text!r}") from None
    if low < 1 or high < low:
        raise ConfigError(f"{name} must be >= 1, and LOW <= HIGH in LOW:HIGH, got {text!r}")
    return low, high
