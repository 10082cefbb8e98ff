"""The KServe gRPC messages: the generated module, and both KServe decoders under hostile bytes.

The gRPC side decodes a ``ModelInferRequest`` (:func:`parse_model_infer`), the HTTP side a
JSON body with Triton's binary tensor extension (:func:`parse_infer_request`); whatever the
bytes, each either yields items or refuses with a 4xx, never crashes. The transport that
carries the messages is tested in ``tests/server/transport/test_grpc.py``.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import ROOT

from batchserve.server import RequestLimits
from batchserve.server.protocols.kserve import generic_items, parse_infer_request
from batchserve.server.protocols.kserve_grpc import CONTENTS_FIELD, parse_model_infer
from batchserve.server.protocols.proto import grpc_service_pb2 as pb
from batchserve.server.statuses import GRPC_TABLE, ApiError


def test_the_generated_module_is_what_the_proto_makes(tmp_path: pathlib.Path) -> None:
    proto = ROOT / "src/batchserve/server/protocols/proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{proto}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(proto / "grpc_service.proto"),
        ],
        check=True,
    )
    made = (tmp_path / "grpc_service_pb2.py").read_text()
    # The one edit, named in the .proto: a pool of its own, beside tritonclient's messages.
    made = made.replace("_descriptor_pool.Default()", "_descriptor_pool.DescriptorPool()")
    assert made == (proto / "grpc_service_pb2.py").read_text()
    assert (tmp_path / "grpc_service_pb2.pyi").read_text() == (
        proto / "grpc_service_pb2.pyi"
    ).read_text()


# -- hostile bytes ----------------------------------------------------------------------------

_DATATYPES = [*CONTENTS_FIELD, "FP8", ""]
_LIMITS = RequestLimits(max_inputs=64)


@st.composite
def infer_messages(draw: st.DrawFn) -> bytes:
    """A ModelInferRequest with arbitrary tensors: shapes, datatypes, contents, raw bytes."""
    request = pb.ModelInferRequest(model_name=draw(st.text(max_size=8)))
    raw = draw(st.booleans())
    for i in range(draw(st.integers(0, 3))):
        datatype = draw(st.sampled_from(_DATATYPES))
        shape = draw(st.lists(st.integers(-2, 5) | st.just(2**40), max_size=4))
        tensor = request.inputs.add(name=f"x{i}", datatype=datatype, shape=shape)
        if raw:
            request.raw_input_contents.append(draw(st.binary(max_size=64)))
        elif datatype == "BYTES":
            tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=8), max_size=6)))
        elif datatype in CONTENTS_FIELD:
            field = CONTENTS_FIELD[datatype]
            values: st.SearchStrategy[Any] = st.integers(-(2**31), 2**31 - 1)
            if field.startswith("uint"):
                values = st.integers(0, 2**32 - 1)
            elif field.startswith("fp"):
                values = st.floats(width=32)
            elif field == "bool_contents":
                values = st.booleans()
            getattr(tensor.contents, field).extend(draw(st.lists(values, max_size=6)))
    for key in draw(st.lists(st.sampled_from(["timeout", "priority", "other"]), max_size=2)):
        param = request.parameters[key]
        choice = draw(st.integers(0, 2))
        if choice == 0:
            param.int64_param = draw(st.integers(-(2**63), 2**63 - 1))
        elif choice == 1:
            param.string_param = draw(st.text(max_size=4))
        else:
            param.double_param = draw(st.floats())
    body = request.SerializeToString()
    cut = draw(st.integers(0, len(body)))
    return body if draw(st.booleans()) else body[:cut] + draw(st.binary(max_size=8))


def _refusal(body: bytes) -> ApiError | None:
    try:
        _, request = parse_model_infer(body)
        generic_items(request, _LIMITS)
    except ApiError as error:
        return error
    return None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256) | infer_messages())
def test_hostile_messages_are_refused_never_crash(body: bytes) -> None:
    error = _refusal(body)
    assert error is None or GRPC_TABLE[error.reason] == "INVALID_ARGUMENT", error


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256), st.integers(-1, 300) | st.just(None))
def test_hostile_binary_tensor_bodies_are_refused_never_crash(
    body: bytes, header_length: int | None
) -> None:
    # The HTTP side's KServe body with Triton's binary tensor extension: JSON, then bytes.
    for candidate in (
        body,
        b'{"inputs":[{"name":"x","datatype":"BYTES","shape":[2],'
        b'"parameters":{"binary_data_size":%d}}]}' % len(body) + body,
    ):
        length = None if header_length is None else str(header_length)
        refusal: ApiError | None = None
        try:
            generic_items(parse_infer_request(candidate, length), _LIMITS)
        except ApiError as error:
            refusal = error
        assert refusal is None or refusal.status in (400, 413, 422), refusal


def test_a_shape_of_no_data_whose_other_axes_overflow_numpy_is_invalid() -> None:
    # Found by the fuzzing above: numpy refused the reshape with a ValueError (a 500).
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="BOOL", shape=[0, *[64] * 11])
    error = _refusal(request.SerializeToString())
    assert error is not None
    assert error.reason == "invalid"
    assert "non-zero axes must multiply to at most" in error.message
