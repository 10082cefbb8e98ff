"""Engines: what runs a model that needs one, and how the best one is picked for this machine.

The core serves any batch function (:mod:`batchserve.models`: the protocol, the synthetic
and faulty models, the SPEC grammar). This layer, above the core and below the drivers
(the server, the simulator), runs the built-in embedding model and any sentence-transformers
folder on PyTorch, ONNX Runtime or OpenVINO. It may import only the core and the
vocabulary; the drivers and the outer layers import it; the core never does.

* :mod:`~batchserve.engines.loader`: load any SPEC; ``minilm``, model folders and Hub ids
  here (the folder's kind judged first, :mod:`batchserve.models.kinds`), the rest handed to
  :mod:`batchserve.models.loader`.
* :mod:`~batchserve.engines.hub`: a model by its Hugging Face Hub id, resolved through
  huggingface_hub's cache (downloaded where the network allows).
* :mod:`~batchserve.engines.cuda_graphs`: a torch engine's passes on a GPU replayed as CUDA
  graphs, one a shape bucket.
* :mod:`~batchserve.engines.runtime`: what the user asked for (backend, device, precision,
  threads, cache) and what it means on this machine.
* :mod:`~batchserve.engines.hardware`: the machine's facts (CPU instructions, GPUs, installed
  backends) and the candidate engines they allow.
* :mod:`~batchserve.engines.choice`: ``--backend auto``: measure each candidate, keep the
  fastest that passes the gate, cache the verdict.
* :mod:`~batchserve.engines.verdict`: what ``auto`` measured and chose (each engine's trial,
  the pure pick, the verdict as cached and shown), no measuring.
* :mod:`~batchserve.engines.quality`, :mod:`~batchserve.engines.quality_set`,
  :mod:`~batchserve.engines.gate`: how close an engine's vectors are to the reference
  engine's, on the shipped quality set (``data/``), and the gate that refuses one too far.
* :mod:`~batchserve.engines.pipeline`: a model folder read once, as sentence-transformers
  reads it: how every engine tokenizes a text and pools its token embeddings.
* :mod:`~batchserve.engines.pooling`: the pooling, ``Dense`` and ``Normalize`` arithmetic
  the pipeline runs, in numpy.
* :mod:`~batchserve.engines.edges`: the texts at a model's edges, and every engine held to
  ``SentenceTransformer.encode`` on each of them.
* :mod:`~batchserve.engines.embeddings`: the PyTorch engine (sentence-transformers);
  :mod:`~batchserve.engines.sequence`: rerankers and classifiers; both through
  :mod:`~batchserve.engines.passes` (length-sorted sub-passes).
* :mod:`~batchserve.engines.export`, :mod:`~batchserve.engines.exported`: ONNX and OpenVINO
  exports into the cache, and the engine that runs them.
* :mod:`~batchserve.engines.corpus`: real text of a realistic length mix that ships with
  every Python (its reference manual's paragraphs): what ``auto`` times engines on.
* :mod:`~batchserve.engines.telemetry`: OpenVINO and NNCF imported with their telemetry off.

A new engine (another runtime for the embedding models) goes here: a backend in
``runtime.BACKENDS`` and ``hardware.candidates``, a class like ``ExportedEmbedder``, a branch
in ``loader``. A new kind of model (say a reranker) is two halves: what the server sees of it
in the core (:mod:`batchserve.models`: its protocol, its ``LoadedModel`` kind, a synthetic
stand-in for the tests) and what runs it here.
"""
