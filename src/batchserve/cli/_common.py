"""Helpers shared by the CLI subcommands: argument types and error reporting."""

from __future__ import annotations

import argparse

from batchserve.errors import ConfigError
from batchserve.units import parse_duration, parse_int_range, parse_rates

__all__ = ["duration", "int_range", "positive_duration", "positive_int", "rates"]


def duration(text: str) -> float:
    """Argparse type: a duration with a unit (``2ms``, ``0.25s``) as float seconds."""
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration(text: str) -> float:
    """Argparse type: a duration with a unit, > 0."""
    value = duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def rates(text: str) -> list[float]:
    """Argparse type: ``600``, ``200,400,600`` or ``START:STOP:STEP`` as rates per second."""
    try:
        return parse_rates(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """Argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def int_range(text: str) -> tuple[int, int]:
    """Argparse type: ``N`` or ``LOW:HIGH``, positive integers (``N`` is ``N:N``)."""
    try:
        return parse_int_range(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
