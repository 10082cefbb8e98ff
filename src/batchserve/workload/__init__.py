"""What is offered and what callers experienced: the layer every load and every prediction shares.

* :mod:`~batchserve.workload.arrivals`: open-loop schedules, fixed before a run starts;
* :mod:`~batchserve.workload.seed`: the Go seed's experiment as data (cost, load, rows);
* :mod:`~batchserve.workload.summary`: a run's figures (ok/s, p50/p99, refusals), the same
  keys and percentile rule for the in-process demo, the HTTP load and the simulator.

Nothing here runs a model or a server: the drivers (:mod:`batchserve.sim`,
:mod:`batchserve.loadgen`) read schedules from here and write summaries with it.
"""
