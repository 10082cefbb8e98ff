"""Adapters to engines users already run; each an optional extra, imported on use.

* :mod:`batchserve.integrations.ray`: Ray Serve replicas that each run batchserve's own
  server, autoscaled on queue depth (``pip install 'batchserve[ray]'``).
"""
