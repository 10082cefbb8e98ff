"""Engines: what runs a model that needs one, and how the best one is picked for this machine.

The core serves any batch function (:mod:`batchserve.models`: the protocol, the synthetic
and faulty models, the SPEC grammar, and :class:`~batchserve.models.engine.Engine`, what
the server may ask of a model on an engine). This layer, above the core and below the
drivers (the server, the simulator), runs the built-in embedding model, any
sentence-transformers folder and any sequence classification folder (a reranker, a
classifier) on PyTorch, ONNX Runtime or OpenVINO. It may import only the core and the
vocabulary; the drivers and the outer layers import it; the core never does.

A model on an engine is one :class:`~batchserve.engines.model.EngineModel`: a runner of its
runtime composed with a head of its kind.

* :mod:`~batchserve.engines.loader`: load any SPEC; ``minilm``, model folders and Hub ids
  here (the folder's kind judged first, :mod:`batchserve.models.kinds`), the rest handed to
  :mod:`batchserve.models.loader`.
* :mod:`~batchserve.engines.hub`: a model by its Hugging Face Hub id, resolved through
  huggingface_hub's cache (downloaded where the network allows).

The model on an engine:

* :mod:`~batchserve.engines.model`: :class:`~batchserve.engines.model.EngineModel`, the
  pass (a head's tokenizing, a runner's sub-passes, the head's rows), its token counts and
  statistics.
* :mod:`~batchserve.engines.runners`: one runner per runtime: torch (on a CPU or a GPU, at
  a precision), an exported graph on ONNX Runtime or OpenVINO.
* :mod:`~batchserve.engines.heads`: one head per kind: an embedding model's vectors, a
  sequence classification model's logits (what an item is, how it is tokenized).
* :mod:`~batchserve.engines.embeddings`: an embedding folder on torch (the pipeline's
  head); :mod:`~batchserve.engines.exported`: the same exported, gated and opened on ONNX
  Runtime or OpenVINO; :mod:`~batchserve.engines.sequence`: a reranker or a classifier
  (the logits head) on torch or an export.
* :mod:`~batchserve.engines.passes`: a pass run as length-sorted sub-passes, and the cost
  each engine learns from them.
* :mod:`~batchserve.engines.cuda_graphs`: a torch engine's sub-passes on a GPU replayed as
  CUDA graphs, one a shape bucket.
* :mod:`~batchserve.engines.pipeline`: an embedding folder read once, as
  sentence-transformers reads it: how every engine tokenizes a text and pools its token
  embeddings.
* :mod:`~batchserve.engines.pooling`: the pooling, ``Dense`` and ``Normalize`` arithmetic
  the pipeline runs, in numpy.
* :mod:`~batchserve.engines.export`: ONNX and OpenVINO exports into the cache.
* :mod:`~batchserve.engines.telemetry`: OpenVINO and NNCF imported with their telemetry off.

Where it runs, and which engine:

* :mod:`~batchserve.engines.runtime`: what the user asked for (backend, device, precision,
  threads, cache) and what it means on this machine.
* :mod:`~batchserve.engines.hardware`: the machine's facts (CPU instructions, GPUs, installed
  backends) and the candidate engines they allow.
* :mod:`~batchserve.engines.choice`: ``--backend auto``: measure each candidate, keep the
  fastest that passes the gate, cache the verdict.
* :mod:`~batchserve.engines.verdict`: what ``auto`` measured and chose (each engine's trial,
  the pure pick, the verdict as cached and shown), no measuring.
* :mod:`~batchserve.engines.corpus`: real text of a realistic length mix that ships with
  every Python (its reference manual's paragraphs): what ``auto`` times engines on.

Whether an engine keeps the model's answers:

* :mod:`~batchserve.engines.quality`, :mod:`~batchserve.engines.quality_set`,
  :mod:`~batchserve.engines.gate`: how close an embedding engine's vectors are to the
  reference engine's, on the shipped quality set (``data/``), and the gate that refuses
  one too far.
* :mod:`~batchserve.engines.ranking_gate`: a reranker's or classifier's engine held to the
  torch reference's rankings and labels on the same set.
* :mod:`~batchserve.engines.edges`: the texts at a model's edges, and every engine held to
  ``SentenceTransformer.encode`` on each of them.

A new runtime goes here: a backend in ``runtime.BACKENDS`` and ``hardware.candidates``, a
runner in :mod:`~batchserve.engines.runners`. A new kind of model is two halves: what the
server sees of it in the core (:mod:`batchserve.models`: its kind, a synthetic stand-in
for the tests) and what runs it here: a head in :mod:`~batchserve.engines.heads` and the
module that builds its engines (as :mod:`~batchserve.engines.sequence` does).
"""
