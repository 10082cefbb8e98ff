"""The live progress of a run, for a person watching.

On a terminal one line is rewritten in place; on a file or a pipe a plain line is written
once a second, so logs stay readable.
"""

from __future__ import annotations

from typing import TextIO

from batchserve.loadgen.sender import Progress

__all__ = ["ProgressDisplay", "format_progress"]


def format_progress(p: Progress, *, total: int, duration_s: float, label: str) -> str:
    """One line describing ``p``."""
    return (
        f"{label}: {p.elapsed_s:5.1f}/{duration_s:g} s  sent {p.sent}/{total}  ok {p.ok}  "
        f"rejected {p.rejected}  timed out {p.timed_out}  errors {p.errors}  "
        f"pending {p.pending}  lag max {p.lag_max_s * 1e3:.1f} ms"
    )


class ProgressDisplay:
    """A progress callback that writes to ``stream``.

    Args:
        stream: where to write (stderr, so that stdout stays machine-readable).
        total: requests in the run.
        duration_s: the schedule's length.
        label: the run's name.
        tty: rewrite one line in place; None asks ``stream.isatty()``.
        plain_every_s: seconds between lines when not on a terminal.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        total: int,
        duration_s: float,
        label: str,
        tty: bool | None = None,
        plain_every_s: float = 1.0,
    ) -> None:
        self._stream = stream
        self._total = total
        self._duration_s = duration_s
        self._label = label
        self._tty = stream.isatty() if tty is None else tty
        self._plain_every_s = plain_every_s
        self._next_plain = plain_every_s
        self._width = 0

    def __call__(self, p: Progress) -> None:
        """Show ``p`` (on a terminal at once; otherwise at most once a period)."""
        line = format_progress(p, total=self._total, duration_s=self._duration_s, label=self._label)
        if self._tty:
            pad = max(0, self._width - len(line))
            self._stream.write("\r" + line + " " * pad)
            self._width = len(line)
        elif p.elapsed_s >= self._next_plain:
            self._stream.write(line + "\n")
            while self._next_plain <= p.elapsed_s:
                self._next_plain += self._plain_every_s
        else:
            return
        self._stream.flush()

    def close(self) -> None:
        """Erase the updating line (terminal only)."""
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0
