"""The transports: what carries a request's bytes to an exchange and its answer back.

* :mod:`~batchserve.server.transport.httptools`: the connection protocol (uvicorn's
  httptools protocol, subclassed) that runs inference exchanges from the parser's
  callbacks, with no task per request; every other request goes on to ASGI.
* :mod:`~batchserve.server.transport.guard`: the limits on a request's head (time, size) and
  the keep-alive timer, below the application.
* :mod:`~batchserve.server.transport.asgi`: the ASGI driver (any ASGI server, in-process
  clients, every route that is not inference) and its I/O primitives.

A transport sees the application only as a :class:`~batchserve.server.exchange.Gate`;
nothing below the transports (the exchange, the protocols) imports from here.
"""
