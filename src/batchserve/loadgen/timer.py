"""A one-shot wake-up at an absolute ``time.monotonic()`` instant, precise to tens of µs.

Why: event-loop timers have millisecond granularity. The stdlib loop rounds its epoll wait
up to the next millisecond (sends up to ~1 ms late); uvloop truncates it (fires up to ~1 ms
early, so a sender that must never send early spins until the instant comes, which costs a
third of a core at 5,000 requests per second). Either way the offered arrival process is
distorted at the scale of a batching window (a few ms).

On Linux a ``timerfd`` armed at an absolute ``CLOCK_MONOTONIC`` time (the clock behind
``time.monotonic()``) wakes the loop through its reader callback with the kernel's timer
precision. :func:`make_timer` returns one, or, where ``timerfd`` is unavailable, a
:class:`LoopTimer` on the loop's own timers that rounds up rather than spin.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["LoopTimer", "TimerFd", "WakeTimer", "make_timer"]

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class WakeTimer(Protocol):
    """Calls its callback once at or after the instant it was last armed for."""

    def arm(self, at: float) -> None:
        """Fire at ``at`` (a ``time.monotonic()`` value); replaces any earlier arming."""

    def close(self) -> None:
        """Disarm and release resources; the timer cannot be used again."""


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.timerfd_settime.argtypes = (
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.c_void_p,
        )
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class TimerFd:
    """A Linux ``timerfd`` on ``CLOCK_MONOTONIC`` watched by the event loop.

    Args:
        loop: the running loop.
        callback: called (from the loop) when the armed instant has passed.

    Raises:
        OSError: ``timerfd`` is not available.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        if _LIBC is None:
            raise OSError("timerfd is not available on this platform")
        fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create failed: {os.strerror(err)}")
        self._fd: int = fd
        self._loop = loop
        self._callback = callback
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.byref(self._spec)
        self._settime = _LIBC.timerfd_settime
        loop.add_reader(fd, self._ready)

    def arm(self, at: float) -> None:
        """Fire at ``at`` (a ``time.monotonic()`` value); replaces any earlier arming."""
        if at <= 0:
            at = 1e-9  # an all-zero it_value would disarm
        sec = math.floor(at)
        value = self._spec.it_value
        value.tv_sec = sec
        value.tv_nsec = min(int((at - sec) * 1e9), 999_999_999) or 1
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, self._spec_ref, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime failed: {os.strerror(err)}")

    def _ready(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # re-armed after it became readable: not yet due
            return
        self._callback()

    def close(self) -> None:
        """Stop watching the descriptor and close it."""
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


class LoopTimer:
    """The portable fallback: the loop's own timer, rounded up to whole milliseconds.

    Args:
        loop: the running loop.
        callback: called (from the loop) at or after the armed instant.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, at: float) -> None:
        """Fire at or up to ~2 ms after ``at`` (a ``time.monotonic()`` value)."""
        if self._handle is not None:
            self._handle.cancel()
        # A loop with a millisecond clock may fire up to 1 ms early: add one.
        delay = math.ceil(max(0.0, at - time.monotonic()) * 1e3) * 1e-3 + 1e-3
        self._handle = self._loop.call_later(delay, self._callback)

    def close(self) -> None:
        """Cancel a pending call."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def make_timer(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> WakeTimer:
    """A :class:`TimerFd` where the platform has one, else a :class:`LoopTimer`."""
    try:
        return TimerFd(loop, callback)
    except OSError:
        return LoopTimer(loop, callback)
