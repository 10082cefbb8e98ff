"""The open-loop load generator behind ``batchserve load``, over HTTP or gRPC.

Requests go out on a schedule fixed in advance (constant or seeded Poisson arrivals), never
paced by answers; each request's latency runs from its scheduled send time, so a stalled
server cannot hide its queue (no coordinated omission), and the generator reports how far it
fell behind its own schedule and how much CPU it used. Modules, outermost first:

* :mod:`~batchserve.loadgen.sweep`: several rates in a row, and the PNG;
* :mod:`~batchserve.loadgen.runner`: the schedule split over sender processes, merged back;
* :mod:`~batchserve.loadgen.report`: records to summary, JSON and CSV;
* :mod:`~batchserve.loadgen.sender`: one process's share on one event loop;
* :mod:`~batchserve.loadgen.client` and :mod:`~batchserve.loadgen.timer`: the connection
  pool and the precise wake-ups it needs; :mod:`~batchserve.loadgen.grpc_client`: KServe's
  ``ModelInfer`` on a gRPC channel instead, for a ``grpc://`` URL;
* :mod:`~batchserve.loadgen.protocol`, :mod:`~batchserve.loadgen.texts`,
  :mod:`~batchserve.loadgen.config`: what goes on the wire;
* :mod:`~batchserve.loadgen.inprocess`: the same open-loop idea on a Batcher in this
  process, with no HTTP in between (``batchserve demo``).

Example::

    from batchserve.loadgen import LoadConfig, run_load

    run = run_load(LoadConfig(url="http://127.0.0.1:8000", rate=500, duration_s=5))
    print(run.report.format_text())
"""

from __future__ import annotations

from batchserve.loadgen.config import DEFAULT_MODEL, LoadConfig
from batchserve.loadgen.progress import ProgressDisplay
from batchserve.loadgen.report import LoadReport, Records, format_csv
from batchserve.loadgen.runner import LoadRun, run_load
from batchserve.loadgen.sender import Progress
from batchserve.loadgen.sweep import plot_sweep, run_sweep
from batchserve.loadgen.texts import generate_texts, read_texts

__all__ = [
    "DEFAULT_MODEL",
    "LoadConfig",
    "LoadReport",
    "LoadRun",
    "Progress",
    "ProgressDisplay",
    "Records",
    "format_csv",
    "generate_texts",
    "plot_sweep",
    "read_texts",
    "run_load",
    "run_sweep",
]
