"""The wire protocols: what a request's body and its answer look like.

OpenAI embeddings (:mod:`~batchserve.server.protocols.openai`), KServe v2
(:mod:`~batchserve.server.protocols.kserve`, its tensors in
:mod:`~batchserve.server.protocols.tensors`) and Triton's extensions to it
(:mod:`~batchserve.server.protocols.triton`); the task APIs of TEI, Cohere, Jina and
Infinity (:mod:`~batchserve.server.protocols.tasks`); and what every route says of a
model's window (:mod:`~batchserve.server.protocols.window`). Each inference protocol is an
:class:`~batchserve.server.exchange.Endpoint`; none knows which transport carries it.

A new protocol is an endpoint: its ``parse(exchange, body)`` reads the exchange (the path's
``model``, ``head``, ``arrival``) and returns a
:class:`~batchserve.server.exchange.Parsed` (the model, the request, its items, a timeout
and a class of work from the body), raising ``ApiError`` for a bad body, or
:class:`~batchserve.server.exchange.ParseError` once the body has named its model; its
``answer`` builds the 200 from the results and ``exchange.request``. It never assigns an
exchange's fields (``tests/test_package.py``): the exchange applies what it returns.
"""
