"""What the CLI subcommands share: argument types, the help's format, shared flag groups.

Defaults are shown by argparse, never typed into a help text: :class:`HelpFormatter` adds
each flag's default to its help. A ``serve`` flag that a config file may set is left unset
(None) so that the file can fill it (flag > file > built-in default); :func:`falls_back`
records the built-in default it then takes, for the help to show.
"""

from __future__ import annotations

import argparse
from typing import Any

from batchserve.errors import ConfigError
from batchserve.units import format_duration, parse_duration, parse_int_range, parse_rates
from batchserve.workload.seed import SEED_FIXED_S, SEED_PER_ITEM_S, SEED_QUEUE, SEED_TIMEOUT_S

__all__ = [
    "HelpFormatter",
    "add_cost_args",
    "add_queue_args",
    "duration",
    "falls_back",
    "int_range",
    "on_off",
    "optional_duration",
    "positive_duration",
    "positive_int",
    "rates",
]


#: The attribute :func:`falls_back` sets on an action.
_FALLS_BACK = "falls_back_to"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; each flag's help ends with its default.

    The default shown is what :func:`falls_back` recorded for the flag, else argparse's
    ``default`` (none for a flag without one, a switch, or a help that says
    ``%(default)s`` itself).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS:
            return action.help
        if "%(default)" in text:
            return text
        shown = getattr(action, _FALLS_BACK, None)
        if shown is not None:
            return f"{text} (default: {str(shown).replace('%', '%%')})"
        if action.default is None or action.default is False or action.default in ("", []):
            return action.help
        return f"{text} (default: %(default)s)"


def falls_back(action: argparse.Action, default: object) -> argparse.Action:
    """Record for the help the ``default`` an unset flag takes (see :class:`HelpFormatter`).

    The flag's own argparse default stays None (or ``[]``): unset, so a config file can set
    it. Returns the action.
    """
    setattr(action, _FALLS_BACK, default)
    return action


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


def optional_duration(text: str) -> float | None:
    """Argparse type: a duration with a unit, or ``none`` for no deadline."""
    if text.strip().lower() == "none":
        return None
    value = duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or 'none'), got {text!r}")
    return value


def on_off(text: str) -> bool:
    """Argparse type: ``on`` or ``off`` (as ``serve --admission`` takes it)."""
    value = text.strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"must be on or off, got {text!r}")


def add_cost_args(p: argparse.ArgumentParser) -> None:
    """The cost model flags: ``--fixed``/``--per-item``, or ``--profile FILE``."""
    g = p.add_argument_group("cost of a forward pass: fixed + n * per_item")
    g.add_argument(
        "--fixed",
        type=duration,
        default=format_duration(SEED_FIXED_S),
        help="per pass (%(default)s)",
    )
    g.add_argument(
        "--per-item",
        type=duration,
        default=format_duration(SEED_PER_ITEM_S),
        help="per item (%(default)s)",
    )
    g.add_argument(
        "--profile",
        metavar="FILE",
        help="take the cost from a profile written by `batchserve profile` (overrides "
        "--fixed/--per-item); the server's cost model then starts from it, as with "
        "`serve --profile`",
    )
    g.add_argument(
        "--overhead",
        type=duration,
        default=0.0,
        help="time the server adds to every pass on top of its cost (0: none); what "
        "`batchserve demo` shows as the gap between measured and predicted",
    )
    g.add_argument(
        "--warm-start",
        action="store_true",
        help="start the server's cost model from the true cost, not from zero as a server "
        "started without --profile does",
    )


def add_queue_args(g: Any) -> None:
    """The deadline and the queue's flags, the same in ``simulate`` and ``tune``."""
    g.add_argument(
        "--timeout",
        type=optional_duration,
        default=format_duration(SEED_TIMEOUT_S),
        help="deadline (%(default)s)",
    )
    g.add_argument("--queue-size", type=positive_int, default=SEED_QUEUE, help="(%(default)s)")
    g.add_argument(
        "--admission",
        type=on_off,
        default="on",
        metavar="on|off",
        help="refuse at once what the cost model predicts will miss its deadline (%(default)s)",
    )
    g.add_argument(
        "--prefetch",
        type=on_off,
        default="on",
        metavar="on|off",
        help="hand the model the next full batch while it is busy, as serve does (%(default)s)",
    )
