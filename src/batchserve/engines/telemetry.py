"""No usage reports leave the server: OpenVINO's and NNCF's telemetry declined, in process.

``import openvino`` loads OpenVINO's converter, which sends an event to Google Analytics
(through the ``openvino-telemetry`` package, a dependency of ``openvino``) unless the user
has run ``opt_in_out --opt_out``, and NNCF sends more while it quantizes. A model server
must not report on its users, and on a machine without internet each attempt costs seconds
of a first start. :func:`decline` makes the consent check answer "declined" for this process
only (the user's own consent file in ``~/intel`` is left alone); every import of OpenVINO or
NNCF in batchserve goes through :func:`openvino` or :func:`nncf`, which decline first.
"""

from __future__ import annotations

import importlib
import types

__all__ = ["decline", "nncf", "openvino"]


def decline() -> None:
    """Answer "declined" to OpenVINO's telemetry consent check, in this process.

    A no-op when ``openvino-telemetry`` is not installed. Idempotent.
    """
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        return

    def declined(self: object, *args: object, **kwargs: object) -> object:
        return ConsentCheckResult.DECLINED

    OptInChecker.check = declined


def openvino() -> types.ModuleType:
    """``import openvino``, with the telemetry declined first."""
    decline()
    return importlib.import_module("openvino")


def nncf() -> types.ModuleType:
    """``import nncf``, with the telemetry declined first."""
    decline()
    return importlib.import_module("nncf")
