"""Tools that exercise a real batchserve: for the project's tests and its benchmarks.

As :mod:`trio.testing` is to trio: nothing in the server imports it. What the test suite
and ``bench/`` both need lives here, so that neither imports the other.

* :mod:`~batchserve.testing.process`: a free port, a process's CPU seconds, waiting for a
  condition with a bound;
* :mod:`~batchserve.testing.rawhttp`: HTTP/1.1 responses read raw off a socket;
* :mod:`~batchserve.testing.harness`: ``batchserve serve`` in a subprocess, open-loop load
  from the project's generator, and the server's outcome counters;
* :mod:`~batchserve.testing.scenarios`: the reliability scenarios, each run to its figures;
* :mod:`~batchserve.testing.fleet`: replicas behind nginx;
* :mod:`~batchserve.testing.tools`: the outside programs they drive (nginx, perf_analyzer...),
  installed when missing.
"""
