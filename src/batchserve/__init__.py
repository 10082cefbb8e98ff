"""batchserve: a Python model server built around dynamic batching."""
