"""The wire protocols: what a request's body and its answer look like.

OpenAI embeddings (:mod:`~batchserve.server.protocols.openai`), KServe v2
(:mod:`~batchserve.server.protocols.kserve`, its tensors in
:mod:`~batchserve.server.protocols.tensors`) and Triton's extensions to it
(:mod:`~batchserve.server.protocols.triton`). Each inference protocol is an
:class:`~batchserve.server.exchange.Endpoint`; none knows which transport carries it.
"""
