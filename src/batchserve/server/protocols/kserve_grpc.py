"""The KServe v2 protocol over gRPC: protobuf messages to and from the HTTP side's values.

The service is ``inference.GRPCInferenceService`` of ``proto/grpc_service.proto``. Nothing
here decides anything the HTTP side does not: a ``ModelInferRequest`` becomes the same
:class:`~batchserve.server.protocols.kserve.InferRequest` an HTTP body becomes (its tensors
through the same :func:`~batchserve.server.protocols.tensors.decode_tensor`, so the same
rules and messages), and its items come from the same
:func:`~batchserve.server.protocols.kserve.parsed`. Metadata, the model configuration,
the statistics and the repository index are the HTTP side's documents, copied into their
messages.

Inputs come as typed ``contents`` (the field of their datatype: ``fp32_contents`` for FP32
and FP16, ``int_contents`` for INT8..INT32, ``bytes_contents`` for BYTES...) or, for every
input at once, as ``raw_input_contents`` (little-endian arrays; BYTES as each element's
4-byte length and bytes), as tritonclient sends them. Outputs are always
``raw_output_contents``, as tritonclient reads them; every output is sent unless
``outputs`` names some. ``parameters.timeout`` (microseconds), ``parameters.priority`` and
``parameters.prompt_name`` (a ``string_param``) are read as over HTTP. The answer's timing
facts and ``x-truncated-inputs`` (how many texts the model's window cut) come as trailing
metadata, the HTTP answer's headers.

:class:`GrpcInferEndpoint` is ModelInfer's part of an exchange: the model is named by the
message (so admission before decoding knows the key, the deadline and the drain, and with
one model served, the model's queue too), the answer is the serialized response.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from batchserve import __version__
from batchserve.batcher import Served
from batchserve.models.loader import LoadedModel
from batchserve.server.exchange import Exchange, Parsed, ParseError, Reply, timing_head
from batchserve.server.protocols import bodies, kserve, triton
from batchserve.server.protocols.proto import grpc_service_pb2 as pb
from batchserve.server.protocols.tensors import (
    DTYPES,
    Tensor,
    decode_tensor,
    encode_tensor,
    pack_bytes,
)
from batchserve.server.protocols.window import truncated_head
from batchserve.server.registry import Registry, ServedModel
from batchserve.server.settings import RequestLimits
from batchserve.server.statuses import ApiError

__all__ = [
    "CONTENTS_FIELD",
    "GrpcInferEndpoint",
    "model_config",
    "model_metadata",
    "model_statistics",
    "parse_model_infer",
    "repository_index",
    "server_metadata",
]

#: Datatype -> the field of ``InferTensorContents`` its typed values are sent in.
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP16": "fp32_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


#: Each field of ``InferTensorContents`` as the numpy type of its protobuf values.
_WIDE = {
    "bool_contents": "?",
    "int_contents": "<i4",
    "int64_contents": "<i8",
    "uint_contents": "<u4",
    "uint64_contents": "<u8",
    "fp32_contents": "<f4",
    "fp64_contents": "<f8",
}


def _param(value: pb.InferParameter) -> Any:
    which = value.WhichOneof("parameter_choice")
    return None if which is None else getattr(value, which)


def _input(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> Tensor:
    spec = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
    if raw is not None:
        return decode_tensor(spec, raw)
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None or any(d < 0 for d in tensor.shape):
        return decode_tensor(spec, b"")  # refused: it names the datatypes and the shape rule
    values = getattr(tensor.contents, field)
    count = 1
    for d in tensor.shape:
        count *= max(d, 0)
    if len(values) != count:
        raise ApiError(
            "invalid",
            f"input {tensor.name!r}: shape {list(tensor.shape)} holds {count} elements, "
            f"contents.{field} has {len(values)}",
            param=f"contents.{field}",
        )
    if tensor.datatype == "BYTES":
        return decode_tensor(spec, pack_bytes(list(values)))
    dtype = np.dtype(DTYPES[tensor.datatype])
    wide = np.array(values, dtype=_WIDE[field])
    if dtype.kind in "iu" and wide.size:
        info = np.iinfo(dtype)
        low, high = int(wide.min()), int(wide.max())
        if low < info.min or high > info.max:
            raise ApiError(
                "invalid",
                f"input {tensor.name!r}: contents.{field} is not {tensor.datatype}: "
                f"{low if low < info.min else high} is outside {info.min}..{info.max}",
                param=f"contents.{field}",
            )
    with np.errstate(over="ignore"):  # FP32 beyond FP16's range is inf, as over HTTP
        narrow = wide.astype(dtype)
    return decode_tensor(spec, narrow.tobytes())


def parse_model_infer(body: bytes) -> tuple[pb.ModelInferRequest, kserve.InferRequest]:
    """Decode a serialized ``ModelInferRequest`` into the HTTP side's request.

    Raises:
        ApiError: ``malformed`` (not a ModelInferRequest, raw contents that do not match the
            inputs), ``invalid`` or ``too_large`` naming the field and the rule.
    """
    try:
        msg = pb.ModelInferRequest.FromString(body)
    except DecodeError as exc:
        raise ApiError("malformed", f"the message is not a ModelInferRequest: {exc}") from None
    inputs = msg.inputs
    if not inputs:
        raise ApiError("invalid", "inputs must hold at least one tensor", param="inputs")
    if len(inputs) > bodies.MAX_TENSORS or len(msg.outputs) > bodies.MAX_TENSORS:
        raise ApiError(
            "too_large",
            f"inputs and outputs must hold at most {bodies.MAX_TENSORS} tensors each, got "
            f"{len(inputs)} and {len(msg.outputs)}",
            param="inputs",
        )
    raw = msg.raw_input_contents
    if raw and len(raw) != len(inputs):
        raise ApiError(
            "malformed",
            f"raw_input_contents must hold one entry per input ({len(inputs)}), got {len(raw)}",
            param="raw_input_contents",
        )
    decoded = [_input(t, raw[i] if raw else None) for i, t in enumerate(inputs)]
    params = msg.parameters
    timeout = params.get("timeout")
    priority = params.get("priority")
    prompt = params.get("prompt_name")
    request = kserve.InferRequest(
        id=msg.id or None,
        inputs=decoded,
        outputs={o.name: True for o in msg.outputs},
        binary_default=True,
        timeout_s=bodies.timeout_param(None if timeout is None else _param(timeout)),
        priority=bodies.priority_param(None if priority is None else _param(priority)),
        prompt_name=bodies.prompt_param(None if prompt is None else _param(prompt)),
    )
    return msg, request


class GrpcInferEndpoint:
    """``ModelInfer`` as an exchange's endpoint (the model named by the message).

    Args:
        registry: the served models.
        limits: the request limits.
    """

    protocol = "grpc"
    #: gRPC carries no media type the server reads (its content type is the transport's).
    body_types: frozenset[str] = frozenset()

    def __init__(self, registry: Registry, limits: RequestLimits) -> None:
        self.registry = registry
        self.limits = limits

    def parse(self, exchange: Exchange, body: bytes) -> Parsed:
        """The model a serialized ``ModelInferRequest`` names, the request and its items."""
        msg, req = parse_model_infer(body)
        model = self.registry.require(msg.model_name, param="model_name")
        try:
            triton.check_version(model.name, msg.model_version or None)
            model.require_batcher()
            return kserve.parsed(model, req, self.limits)
        except Exception as exc:
            raise ParseError(model, exc) from None

    def answer(self, exchange: Exchange, served: list[Served[Any]]) -> Reply:
        """The serialized ``ModelInferResponse``, every output raw, with the timing facts.

        The facts (the HTTP answer's headers: timing, ``x-truncated-inputs``) become the
        call's trailing metadata.
        """
        model = exchange.model
        assert model is not None
        assert model.loaded is not None
        request: kserve.InferRequest = exchange.request
        outputs = kserve.stack_outputs(model.loaded.kind, [s.output for s in served])
        names = kserve.requested_outputs(request, outputs)
        response = pb.ModelInferResponse(
            model_name=model.name, model_version=triton.VERSION, id=request.id or ""
        )
        for name in names:
            desc, raw = encode_tensor(name, outputs[name], binary=True)
            response.outputs.add(name=name, datatype=desc["datatype"], shape=desc["shape"])
            assert raw is not None
            response.raw_output_contents.append(raw)
        head = timing_head(served) + truncated_head(model.loaded, request.texts)
        return Reply(200, [], response.SerializeToString(), head=head)

    def error_body(self, error: ApiError) -> bytes:
        """The status message: the error's own (it names the field and the rule)."""
        return error.message.encode()


def server_metadata() -> pb.ServerMetadataResponse:
    """``ServerMetadata``: the HTTP side's ``GET /v2``."""
    meta = kserve.server_metadata()
    return pb.ServerMetadataResponse(
        name=meta["name"], version=__version__, extensions=meta["extensions"]
    )


def model_metadata(name: str, loaded: LoadedModel | None) -> pb.ModelMetadataResponse:
    """``ModelMetadata``: the HTTP side's ``GET /v2/models/{name}``."""
    return json_format.ParseDict(kserve.model_metadata(name, loaded), pb.ModelMetadataResponse())


def model_config(model: ServedModel) -> pb.ModelConfigResponse:
    """``ModelConfig``: Triton's model configuration, as ``GET .../config`` gives it."""
    config = triton.model_config(model)
    # Empty lists Triton's proto types as messages this file leaves out.
    for key in ("batch_input", "batch_output", "model_warmup"):
        config.pop(key, None)
    return pb.ModelConfigResponse(config=json_format.ParseDict(config, pb.ModelConfig()))


def model_statistics(entries: list[dict[str, Any]]) -> pb.ModelStatisticsResponse:
    """``ModelStatistics``: the entries of ``GET /v2/models/stats``."""
    response = pb.ModelStatisticsResponse()
    for entry in entries:
        entry = {k: v for k, v in entry.items() if k not in ("response_stats", "memory_usage")}
        json_format.ParseDict(entry, response.model_stats.add())
    return response


def repository_index(entries: list[dict[str, str]]) -> pb.RepositoryIndexResponse:
    """``RepositoryIndex``: the entries of ``POST /v2/repository/index``."""
    return json_format.ParseDict({"models": entries}, pb.RepositoryIndexResponse())
