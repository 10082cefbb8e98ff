"""Tools that exercise a real batchserve: the harness of the project's tests and benchmarks.

As :mod:`trio.testing` is to trio, except that it is not shipped: it is code of the
repository (``harness/``), installed in development mode by ``scripts/install`` with the
``dev`` extra, and no wheel of batchserve holds it. Nothing in batchserve imports it. What
the test suite and ``bench/`` both need lives here, so that neither imports the other.

* :mod:`~batchserve_testing.process`: a free port, a process's CPU seconds, waiting for a
  condition with a bound;
* :mod:`~batchserve_testing.rawhttp`: HTTP/1.1 responses read raw off a socket;
* :mod:`~batchserve_testing.harness`: ``batchserve serve`` in a subprocess, open-loop load
  from the project's generator, and the server's outcome counters;
* :mod:`~batchserve_testing.scenarios`: the reliability scenarios, each run to its figures;
* :mod:`~batchserve_testing.fleet`: replicas behind nginx;
* :mod:`~batchserve_testing.tools`: the outside programs they drive (nginx, perf_analyzer...),
  found where ``scripts/install-tools`` put them; nothing here installs anything.
* :mod:`~batchserve_testing.bench`: what the bench's scripts share: servers started and
  stopped, the request path's contenders, ``wrk``;
* :mod:`~batchserve_testing.closed_loop`: a light closed loop of embedding requests on
  kept-alive connections, with the client's CPU;
* :mod:`~batchserve_testing.arithmetic`: an encoder's FLOPs a token, and torch's matrix
  product at its shapes.
"""
