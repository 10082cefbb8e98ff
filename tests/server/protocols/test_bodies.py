"""Each body described once: its reader and its schema agree, and the document states it."""

from __future__ import annotations

from typing import Any

import pytest

from batchserve.server.ops.openapi import openapi_spec
from batchserve.server.protocols import bodies
from batchserve.server.protocols.catalog import INFERENCE
from batchserve.server.protocols.fields import Body, Served
from batchserve.server.settings import RequestLimits
from batchserve.server.statuses import ApiError

# schemathesis's own validator (a dev dependency through it); untyped, hence Any.
jsonschema: Any = pytest.importorskip("jsonschema")

LIMITS = RequestLimits()
#: A model of 4 dimensions that declares 2 (Matryoshka): a dimensions field takes 2 or 4.
SERVED = Served(models=("m",), limits=LIMITS, dimensions=(2, 4), prompts=("query",))

#: (body, JSON it takes, JSON it refuses naming this field): a schema must say the same.
CASES: list[tuple[Body, Any, Any, str]] = [
    (bodies.OPENAI_EMBEDDINGS, {"input": ["a", "b"]}, {"input": []}, "input"),
    (
        bodies.OPENAI_EMBEDDINGS,
        {"input": "a", "dimensions": 2},
        {"input": "a", "dimensions": 0},
        "dimensions",
    ),
    (
        bodies.OPENAI_EMBEDDINGS,
        {"input": "a", "encoding_format": "base64"},
        {"input": "a", "encoding_format": "hex"},
        "encoding_format",
    ),
    (
        bodies.INFINITY_EMBEDDINGS,
        {"input": [""], "dimensions": 0},
        {"input": "a", "modality": "image"},
        "modality",
    ),
    (
        bodies.EMBED,
        {"inputs": ["", "a"], "parameters": {"truncate": False}},
        {"inputs": "a", "parameters": {"normalize": 1}},
        "normalize",
    ),
    (bodies.EMBED, {"inputs": "a", "prompt_name": "query"}, {"inputs": 3}, "inputs"),
    (
        bodies.SIMILARITY,
        {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
        {"inputs": {"source_sentence": "", "sentences": ["b"]}},
        "inputs.source_sentence",
    ),
    (
        bodies.TEI_RERANK,
        {"query": "q", "texts": ["", "b"], "raw_scores": True},
        {"query": "q", "texts": []},
        "texts",
    ),
    (bodies.PREDICT, {"inputs": [["a", "b"], ["c"]]}, {"inputs": [["a", "b", "c"]]}, "inputs[0]"),
    (
        bodies.COHERE_V2_RERANK,
        {"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1},
        {"query": "q", "documents": ["a"], "top_n": 0},
        "top_n",
    ),
    (
        bodies.INFINITY_RERANK,
        {"query": "q", "documents": ["a"]},
        {"query": "", "documents": ["a"]},
        "query",
    ),
    (bodies.CLASSIFY, {"input": ["a"], "raw_scores": False}, {"input": [""]}, "input[0]"),
    (bodies.TOKENIZE, {"inputs": ["a", "b"]}, {"inputs": ""}, "inputs"),
    (bodies.DECODE, {"ids": [[1, 2], [3]]}, {"ids": [-1]}, "ids"),
]


@pytest.mark.parametrize(("body", "taken", "refused", "field"), CASES)
def test_the_reader_and_the_schema_of_a_body_agree(
    body: Body, taken: Any, refused: Any, field: str
) -> None:
    schema = body.schema(SERVED)
    body.read(taken, LIMITS)
    jsonschema.validate(taken, schema)
    with pytest.raises(ApiError) as error:
        body.read(refused, LIMITS)
    assert error.value.param == field
    assert field.split("[")[0].split(".")[-1] in error.value.message
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(refused, schema)


def test_a_body_reads_defaults_and_parameters_override_only_what_they_hold() -> None:
    read = bodies.EMBED.read({"inputs": "a", "normalize": False}, LIMITS)
    assert read["inputs"] == ["a"]
    assert (read["truncate"], read["normalize"], read["dimensions"]) == (True, False, None)
    assert read["parameters"] is None
    given = bodies.EMBED.read({"inputs": "a", "parameters": {"dimensions": 2}}, LIMITS)
    assert given["parameters"] == {"dimensions": 2}
    with pytest.raises(ApiError, match=r"^inputs is required: a string or a list of strings$"):
        bodies.EMBED.read({}, LIMITS)
    with pytest.raises(ApiError, match=r"^body must be a JSON object, got list$"):
        bodies.EMBED.read([], LIMITS)
    # A required field sent as null is checked by its rule, which names it and its type.
    with pytest.raises(ApiError, match=r"^inputs must be a list of strings, got NoneType$"):
        bodies.EMBED.read({"inputs": None}, LIMITS)


def test_the_document_states_the_bodies_the_parsers_read() -> None:
    spec = openapi_spec(["m"], dimensions=[2, 4], prompts=["query"])
    for route in INFERENCE:
        content = spec["paths"][route.path][route.method.lower()]["requestBody"]["content"]
        schema = content["application/json"]["schema"]
        if isinstance(route.body, str):
            assert schema == {"$ref": f"#/components/schemas/{route.body}"}
        else:
            assert schema == route.body.schema(SERVED)
    components = spec["components"]["schemas"]
    assert components["EmbeddingsRequest"] == bodies.OPENAI_EMBEDDINGS.schema(SERVED)
    assert components["InfinityEmbeddingsRequest"] == bodies.INFINITY_EMBEDDINGS.schema(SERVED)
    assert components["InferRequest"] == bodies.INFER.schema(SERVED)


def test_kserve_s_fields_around_the_tensors_are_read_from_the_description() -> None:
    read = bodies.INFER.read(
        {"inputs": [{}], "parameters": {"timeout": 2_000_000, "priority": 1}}, LIMITS
    )
    assert read["parameters"]["timeout"] == 2.0
    assert read["parameters"]["priority"] == 1
    assert read["parameters"]["binary_data_output"] is False
    with pytest.raises(ApiError, match="inputs must be a non-empty list of tensors"):
        bodies.INFER.read({"inputs": []}, LIMITS)
    with pytest.raises(ApiError, match=r"parameters.timeout must be a number of microseconds"):
        bodies.INFER.read({"inputs": [{}], "parameters": {"timeout": -1}}, LIMITS)
