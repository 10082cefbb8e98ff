"""OpenVINO's and NNCF's usage reports are declined in batchserve's process."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

import batchserve

pytest.importorskip("openvino_telemetry")

# A fresh process: the suite's own already declined (tests/engine_fixtures.py). Without the
# decline, no consent file reads as consent (the check is "opt-out"); HOME points at an
# empty folder so the user's own consent file plays no part. PYTHONPATH: the probe imports
# the batchserve under test, not whichever the interpreter has installed.
SRC = str(pathlib.Path(batchserve.__file__).parent.parent)
PROBE = """
import sys
from batchserve.engines import telemetry
if sys.argv[1] == "declined":
    telemetry.openvino()
from openvino_telemetry import Telemetry
t = Telemetry(app_name="probe", app_version="0", tid="G-PROBE", backend="ga4",
              enable_opt_in_dialog=False)
print(t.consent)
"""


@pytest.mark.parametrize(("how", "consent"), [("declined", "False"), ("as-is", "True")])
def test_importing_openvino_through_batchserve_declines_its_telemetry(
    how: str, consent: str, tmp_path: pathlib.Path
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, how],
        capture_output=True,
        text=True,
        check=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": SRC},
        timeout=120,
    ).stdout
    assert out.strip().splitlines()[-1] == consent
