"""KServe v2 tensors, in JSON and in Triton's binary tensor data extension.

A v2 request is JSON. With the binary extension (what ``tritonclient.http`` sends by
default) the header ``Inference-Header-Content-Length: N`` says the first N bytes of the body
are the JSON, and each input whose ``parameters.binary_data_size`` is set takes that many
bytes from what follows, in input order: numbers as little-endian raw arrays, ``BYTES`` as
each element's 4-byte little-endian length followed by its bytes. A response is encoded the
same way for each output the client asked in binary.

:func:`decode_tensor` and :func:`encode_tensor` turn one tensor into a numpy array (or a
list of ``bytes`` for ``BYTES``) and back; every check names the tensor and the rule.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.server.statuses import ApiError

__all__ = [
    "DTYPES",
    "Tensor",
    "datatype_of",
    "decode_tensor",
    "encode_tensor",
    "pack_bytes",
    "unpack_bytes",
]

#: v2 datatype -> numpy dtype (little-endian), for every numeric type.
DTYPES: dict[str, str] = {
    "BOOL": "?",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
_KIND_TO_DATATYPE = {np.dtype(v).str.replace("|", "<"): k for k, v in DTYPES.items()}
_LEN = struct.Struct("<I")


@dataclass(frozen=True, slots=True, kw_only=True)
class Tensor:
    """A decoded tensor.

    Attributes:
        name: its name in the request.
        datatype: the v2 datatype (``FP32``, ``BYTES``...).
        shape: its shape.
        value: a numpy array of that shape, or for ``BYTES`` a flat list of ``bytes``.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    value: Any


def unpack_bytes(raw: bytes, count: int, name: str) -> list[bytes]:
    """Split a binary ``BYTES`` tensor into its ``count`` elements.

    Raises:
        ApiError: ``malformed`` when the lengths do not add up to ``raw``.
    """
    out: list[bytes] = []
    pos = 0
    view = memoryview(raw)
    for _ in range(count):
        if pos + 4 > len(raw):
            raise ApiError("malformed", f"input {name!r}: BYTES data ends inside a length")
        (n,) = _LEN.unpack_from(raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise ApiError("malformed", f"input {name!r}: BYTES element runs past the data")
        out.append(bytes(view[pos : pos + n]))
        pos += n
    if pos != len(raw):
        raise ApiError(
            "malformed",
            f"input {name!r}: binary_data_size is {len(raw)} bytes but {count} BYTES elements "
            f"take {pos}",
        )
    return out


def pack_bytes(elements: list[bytes]) -> bytes:
    """Serialize ``BYTES`` elements: each a 4-byte little-endian length, then its bytes."""
    parts = []
    for e in elements:
        parts.append(_LEN.pack(len(e)))
        parts.append(e)
    return b"".join(parts)


#: The most axes a tensor may have (numpy's own limit is 64).
MAX_DIMS = 32
#: The most its non-zero axes may multiply to (numpy's limit on bytes is 2**63 - 1).
MAX_SHAPE_PRODUCT = 2**48


def _shape(spec: Any, name: str) -> tuple[int, ...]:
    if not isinstance(spec, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in spec
    ):
        raise ApiError(
            "invalid",
            f"inputs[{name!r}].shape must be a list of integers >= 0, got {spec!r:.200}",
            param="shape",
        )
    if len(spec) > MAX_DIMS:
        raise ApiError(
            "invalid",
            f"inputs[{name!r}].shape must have at most {MAX_DIMS} axes, got {len(spec)}",
            param="shape",
        )
    # numpy refuses a shape whose axes other than 0 multiply past its size limit, even with
    # an axis of 0 (no data at all): refused here, by name, not as a fault of the server.
    if math.prod(d for d in spec if d) > MAX_SHAPE_PRODUCT:
        raise ApiError(
            "invalid",
            f"inputs[{name!r}].shape's non-zero axes must multiply to at most "
            f"{MAX_SHAPE_PRODUCT}, got {list(spec)!r:.200}",
            param="shape",
        )
    return tuple(spec)


def decode_tensor(spec: dict[str, Any], binary: bytes | None) -> Tensor:
    """Decode one request input from its JSON description and, if binary, its bytes.

    Raises:
        ApiError: ``invalid`` or ``malformed`` naming the tensor and the rule broken.
    """
    name = spec.get("name")
    if not isinstance(name, str):
        raise ApiError("invalid", f"inputs[].name must be a string, got {name!r}", "name")
    datatype = spec.get("datatype")
    # A JSON body may name any value here; a list or an object is not a key of DTYPES.
    if not isinstance(datatype, str) or (datatype != "BYTES" and datatype not in DTYPES):
        raise ApiError(
            "invalid",
            f"inputs[{name!r}].datatype must be BYTES or one of {', '.join(DTYPES)}, "
            f"got {datatype!r:.200}",
            param="datatype",
        )
    shape = _shape(spec.get("shape"), name)
    count = math.prod(shape)
    if binary is not None:
        if datatype == "BYTES":
            return Tensor(
                name=name, datatype=datatype, shape=shape, value=unpack_bytes(binary, count, name)
            )
        dtype = np.dtype(DTYPES[datatype])
        if len(binary) != count * dtype.itemsize:
            raise ApiError(
                "malformed",
                f"input {name!r}: shape {list(shape)} of {datatype} needs "
                f"{count * dtype.itemsize} bytes, binary_data_size is {len(binary)}",
            )
        arr = np.frombuffer(binary, dtype=dtype).reshape(shape)
        return Tensor(name=name, datatype=datatype, shape=shape, value=arr)
    if "data" not in spec:
        raise ApiError(
            "invalid",
            f"input {name!r} needs 'data' or parameters.binary_data_size",
            param="data",
        )
    flat = _flatten(spec["data"])
    if len(flat) != count:
        raise ApiError(
            "invalid",
            f"input {name!r}: shape {list(shape)} holds {count} elements, data has {len(flat)}",
            param="data",
        )
    if datatype == "BYTES":
        elements = []
        for v in flat:
            if not isinstance(v, str):
                raise ApiError(
                    "invalid",
                    f"input {name!r}: BYTES data must be strings, got {type(v).__name__}",
                    param="data",
                )
            try:
                elements.append(v.encode())
            except UnicodeEncodeError:
                raise ApiError(
                    "invalid",
                    f"input {name!r}: BYTES data must be valid Unicode text, got a lone "
                    "surrogate (half of an escaped UTF-16 pair)",
                    param="data",
                ) from None
        return Tensor(name=name, datatype=datatype, shape=shape, value=elements)
    try:
        arr = np.asarray(flat, dtype=np.dtype(DTYPES[datatype])).reshape(shape)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ApiError(
            "invalid", f"input {name!r}: data is not {datatype}: {exc}", param="data"
        ) from None
    return Tensor(name=name, datatype=datatype, shape=shape, value=arr)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(v, list) for v in data):
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def datatype_of(values: Any) -> str:
    """The v2 datatype of a numpy array (``BYTES`` for strings, bytes and objects)."""
    arr = np.asarray(values)
    if arr.dtype.kind in "OSU":
        return "BYTES"
    key = arr.dtype.newbyteorder("<").str if arr.dtype.itemsize > 1 else arr.dtype.str
    return _KIND_TO_DATATYPE.get(key.replace("|", "<"), "BYTES")


def encode_tensor(
    name: str, values: npt.NDArray[Any], *, binary: bool
) -> tuple[dict[str, Any], bytes | None]:
    """Describe an output tensor for the response; with ``binary`` also return its bytes."""
    datatype = datatype_of(values)
    shape = list(values.shape)
    desc: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if datatype == "BYTES":
        elements = [
            v if isinstance(v, bytes) else str(v).encode() for v in values.reshape(-1).tolist()
        ]
        if binary:
            raw = pack_bytes(elements)
            desc["parameters"] = {"binary_data_size": len(raw)}
            return desc, raw
        desc["data"] = [e.decode("utf-8", "replace") for e in elements]
        return desc, None
    arr = np.ascontiguousarray(values, dtype=np.dtype(DTYPES[datatype]))
    if binary:
        raw = arr.tobytes()
        desc["parameters"] = {"binary_data_size": len(raw)}
        return desc, raw
    desc["data"] = arr.reshape(-1).tolist()
    return desc, None
