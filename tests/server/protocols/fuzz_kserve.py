"""Coverage-guided fuzzing (atheris, libFuzzer) of the two KServe request decoders.

Targets, each a function of one input's bytes:

* ``grpc``: a serialized ``ModelInferRequest`` decoded as ModelInfer decodes it into its
  exchange: :func:`~batchserve.server.protocols.kserve_grpc.parse_model_infer`, then the
  items of both kinds of model (:func:`~batchserve.server.protocols.kserve.embedding_items`
  and :func:`~batchserve.server.protocols.kserve.generic_items`) and the outputs it asks
  for;
* ``http``: the HTTP side's KServe body with Triton's binary tensor extension (JSON, then
  raw tensor bytes): the first byte picks the ``Inference-Header-Content-Length`` (none, or
  a length near the body's), the rest is the body, decoded by
  :func:`~batchserve.server.protocols.kserve.parse_infer_request` and made into items.

The rule both must keep: an input is either accepted or refused with an
:class:`~batchserve.server.statuses.ApiError` of a client's reason (gRPC
``INVALID_ARGUMENT``; HTTP 400, 413 or 422). Anything else raised is a crash: libFuzzer
stops, prints the traceback and writes the input to ``-artifact_prefix``.

The ``batchserve`` modules are imported under atheris's instrumentation, so the fuzzer
sees which of their branches an input reaches; each run starts from a seed corpus of valid
requests written here. Run::

    python tests/server/protocols/fuzz_kserve.py grpc CORPUS_DIR -max_total_time=60

(libFuzzer's flags after the target; ``test_fuzz.py`` runs each for a few seconds,
``fuzz_campaign.py`` for longer, keeping the corpus.)
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports(include=["batchserve"]):
    from batchserve.server.protocols import kserve
    from batchserve.server.protocols.kserve_grpc import parse_model_infer
    from batchserve.server.protocols.proto import grpc_service_pb2 as pb
    from batchserve.server.protocols.tensors import pack_bytes
    from batchserve.server.settings import RequestLimits
    from batchserve.server.statuses import GRPC_TABLE, STATUS_TABLE, ApiError

LIMITS = RequestLimits(max_inputs=64)
OUTPUTS = {"embedding": "vector"}


def _items(request: kserve.InferRequest) -> None:
    # Both kinds of model a request can reach, and the outputs it asks for.
    for make in (kserve.embedding_items, kserve.generic_items):
        try:
            make(request, LIMITS)
        except ApiError as error:
            _client_error(error)
    kserve.requested_outputs(request, OUTPUTS)


def _client_error(error: ApiError) -> None:
    if STATUS_TABLE[error.reason][0] not in (400, 413, 422):
        raise AssertionError(f"a refusal that is not the client's: {error.reason}: {error}")


def grpc_target(data: bytes) -> None:
    """One serialized ModelInferRequest, decoded as ModelInfer decodes it."""
    try:
        _, request = parse_model_infer(data)
    except ApiError as error:
        if GRPC_TABLE[error.reason] != "INVALID_ARGUMENT":
            raise AssertionError(f"not INVALID_ARGUMENT: {error.reason}: {error}") from None
        return
    try:
        _items(request)
    except ApiError as error:
        _client_error(error)


def http_target(data: bytes) -> None:
    """One HTTP KServe body (binary tensor extension); the first byte picks the header."""
    if not data:
        return
    pick, body = data[0], data[1:]
    # 0: no header; else a length around the JSON part's likely end (the body's first '}'
    # followed by what is left), or the byte itself.
    header: str | None = None
    if pick:
        end = body.rfind(b"}") + 1
        header = str(end + (pick % 5) - 2 if pick < 128 else pick - 128)
    try:
        request = kserve.parse_infer_request(body, header)
        _items(request)
    except ApiError as error:
        _client_error(error)


TARGETS: dict[str, Callable[[bytes], None]] = {"grpc": grpc_target, "http": http_target}


def seeds(target: str) -> list[bytes]:
    """Valid requests to start from."""
    if target == "grpc":
        raw = pb.ModelInferRequest(model_name="m", id="1")
        raw.inputs.add(name="text", datatype="BYTES", shape=[2])
        raw.raw_input_contents.append(pack_bytes([b"hello", b"world"]))
        raw.parameters["timeout"].int64_param = 250_000
        raw.outputs.add(name="embedding")
        typed = pb.ModelInferRequest(model_name="m")
        x = typed.inputs.add(name="x", datatype="FP32", shape=[2, 2])
        x.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
        y = typed.inputs.add(name="y", datatype="INT8", shape=[2])
        y.contents.int_contents.extend([-1, 1])
        typed.parameters["priority"].string_param = "high"
        return [raw.SerializeToString(), typed.SerializeToString()]
    head = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1, 2],
                "parameters": {"binary_data_size": 8},
            },
            {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
        ],
        "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}],
        "parameters": {"timeout": 1000},
    }
    first = json.dumps(head).encode()
    plain = json.dumps(
        {"inputs": [{"name": "t", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}
    )
    return [b"\x80" + first + b"\0" * 8, b"\x02" + first + b"\0" * 8, b"\0" + plain.encode()]


def main(argv: list[str]) -> None:
    """``fuzz_kserve.py TARGET CORPUS_DIR [libFuzzer flags]``: fuzz until libFuzzer stops."""
    target = TARGETS[argv[1]]
    corpus = pathlib.Path(argv[2])
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds(argv[1])):
        (corpus / f"seed-{i}").write_bytes(seed)
    atheris.Setup([argv[0], *argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
