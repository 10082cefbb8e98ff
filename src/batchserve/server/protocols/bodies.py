"""Every inference body, described once: the parsers read it, the OpenAPI document states it.

Each body is a :class:`~batchserve.server.protocols.fields.Body`, a table of fields in the
order the parser checks them: OpenAI's and Infinity's embeddings, TEI's ``/embed``,
``/rerank``, ``/predict``, ``/similarity``, ``/``, ``/tokenize`` and ``/decode``, Cohere's
and Jina's ``/v1/rerank`` and ``/v2/rerank``, Infinity's ``/rerank`` and ``/classify``. A
protocol's parser calls :meth:`Body.read <batchserve.server.protocols.fields.Body.read>`
and builds its request from the checked values; :mod:`batchserve.server.ops.openapi` writes
each body's schema with :meth:`Body.schema <batchserve.server.protocols.fields.Body.schema>`.

A field read from two places (TEI's ``truncate`` in the body or in ``parameters``) is
described in both bodies; a field a parser reads for its clients but does not offer
(``truncation_direction``, Cohere's ``raw_scores``) is described and not documented.
KServe's infer body is described around its tensors: a tensor's data against its shape and
datatype is beyond a table of fields (:mod:`~batchserve.server.protocols.kserve` decodes
them, and the OpenAPI document states a tensor as a component of its own).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from batchserve.server.protocols.fields import (
    Body,
    Choice,
    Choices,
    Count,
    Custom,
    Field,
    Flag,
    Name,
    OneOrMany,
    PromptName,
    Served,
    Text,
    Texts,
    check_count,
    check_text,
)
from batchserve.server.statuses import ApiError

if TYPE_CHECKING:
    from batchserve.server.settings import RequestLimits

__all__ = [
    "CLASSIFY",
    "COHERE_V1_EMBED",
    "COHERE_V1_RERANK",
    "COHERE_V2_EMBED",
    "COHERE_V2_RERANK",
    "DECODE",
    "EMBED",
    "EMBED_ALL",
    "EMBEDDING_TYPE",
    "EMBEDDING_TYPES",
    "EMBED_SPARSE",
    "EMBED_PARAMETERS",
    "INFINITY_EMBEDDINGS",
    "INFER",
    "INFINITY_RERANK",
    "LONG_INPUTS",
    "INPUT_TYPES",
    "MAX_TENSORS",
    "OPENAI_EMBEDDINGS",
    "PREDICT",
    "ROOT",
    "SIMILARITY",
    "TEI_RERANK",
    "TOKENIZE",
    "embedding_texts",
    "predict_inputs",
    "priority_param",
    "prompt_param",
    "tensor_parameters",
    "timeout_param",
]


# -- OpenAI's and Infinity's embeddings ---------------------------------------------------


def embedding_texts(value: Any, limits: RequestLimits, allow_empty: bool) -> list[str]:
    """OpenAI's ``input``: a text or a non-empty list of texts, read as a list.

    Raises:
        ApiError: ``invalid`` or ``too_large``, naming ``input`` or ``input[i]``.
    """
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list):
        if not value:
            raise ApiError("invalid", "input must not be an empty list", param="input")
        texts = value
    else:
        raise ApiError(
            "invalid",
            f"input must be a string or a list of strings, got {type(value).__name__}",
            param="input",
        )
    if len(texts) > limits.max_inputs:
        raise ApiError(
            "too_large",
            f"input must hold at most {limits.max_inputs} items (--max-inputs), got {len(texts)}",
            param="input",
        )
    single = isinstance(value, str)
    for i, text in enumerate(texts):
        where = "input" if single else f"input[{i}]"
        if not isinstance(text, str):
            hint = (
                " (token arrays are not supported; send text)"
                if isinstance(text, int | list)
                else ""
            )
            raise ApiError(
                "invalid",
                f"{where} must be a string, got {type(text).__name__}{hint}",
                param=where,
            )
        if not text and not allow_empty:
            raise ApiError("invalid", f"{where} must not be an empty string", param=where)
        if not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError:
                raise ApiError(
                    "invalid",
                    f"{where} must be valid Unicode text, got a lone surrogate "
                    "(half of an escaped UTF-16 pair)",
                    param=where,
                ) from None
        if len(text) > limits.max_input_chars:
            raise ApiError(
                "too_large",
                f"{where} must be at most {limits.max_input_chars} characters "
                f"(--max-input-chars), got {len(text)}",
                param=where,
            )
    return texts


def _embedding_input(allow_empty: bool) -> Field:
    # The limits are stated in words: they are the deployment's, and over one is 413.
    def doc(served: Served) -> str:
        limits = served.limits
        what = (
            "; an empty text is embedded, as Infinity does. Over a limit: 413."
            if allow_empty
            else ", none empty; over a limit: 413."
        )
        return (
            f"A text, or a list of at most {limits.max_inputs} texts (--max-inputs), each of "
            f"at most {limits.max_input_chars} characters (--max-input-chars){what}"
        )

    text = {"type": "string"} if allow_empty else {"type": "string", "minLength": 1}
    return Field(
        name="input",
        rule=Custom(
            read=lambda value, where, limits: embedding_texts(value, limits, allow_empty),
            shape=lambda served: {"oneOf": [text, {"type": "array", "items": text, "minItems": 1}]},
        ),
        required=True,
        missing="input is required: a string or a list of strings",
        doc=doc,
    )


def _user(value: Any, where: str, limits: RequestLimits) -> str:
    if not isinstance(value, str):
        raise ApiError("invalid", f"user must be a string, got {type(value).__name__}", "user")
    return value


_FORMAT = Field(
    name="encoding_format",
    rule=Choice(values=("float", "base64"), says="'float' or 'base64'"),
    default="float",
    states_default=True,
)
_USER = Field(
    name="user",
    rule=Custom(read=_user, shape=lambda served: {"type": ["string", "null"]}),
    doc="Ignored.",
)

#: ``long_inputs`` on the embedding routes: split inputs over the model's window into
#: windows, their vectors pooled (:mod:`~batchserve.server.protocols.long_inputs`).
LONG_INPUTS = Body(
    fields=(
        Field(
            name="split",
            rule=Flag(),
            default=False,
            states_default=True,
            doc="Split each input over the model's window into windows (on token boundaries, "
            "each with the model's special tokens and prompt), embed each, and pool their "
            "vectors by a mean weighted by each window's tokens (then unit length if the "
            "model's vectors are). False: truncate, the default.",
        ),
        Field(
            name="overlap",
            rule=Count(minimum=0),
            default=0,
            states_default=True,
            doc="Tokens consecutive windows share (less than a window holds).",
        ),
    ),
    nullable=True,
    doc="What to do with inputs longer than the model's window. Each window is an item of "
    "the batcher: the request's item count, usage and token counts are its windows'.",
    message='long_inputs must be an object ({"split": true, "overlap": N}) or null',
)
_LONG_INPUTS = Field(name="long_inputs", rule=LONG_INPUTS)
#: Cohere's ``embedding_types``: the quantized types (:mod:`batchserve.models.quantize`) and
#: ``base64`` (the float vector's little-endian float32 bytes).
EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
#: The types scaled on a model's calibration ranges (refused by a model without them).
_CALIBRATED = ("int8", "uint8")
#: The extra field of OpenAI's ``/v1/embeddings`` and TEI's ``/embed``: one quantized type.
EMBEDDING_TYPE = Field(
    name="embedding_type",
    rule=Choice(
        values=EMBEDDING_TYPES[:5],
        says="'float', 'int8', 'uint8', 'binary' or 'ubinary'",
        calibrated=_CALIBRATED,
    ),
    default="float",
    states_default=True,
    doc="batchserve's extension: the vectors as Cohere's `embedding_types` make them (int8, "
    "uint8, binary, ubinary as JSON integers; calibrated as `/v2/embed`'s).",
)

#: ``POST /v1/embeddings``.
OPENAI_EMBEDDINGS = Body(
    fields=(
        Field(
            name="model",
            rule=Name(nonempty=True, served=True),
            doc="Default: the first served model.",
        ),
        _embedding_input(allow_empty=False),
        _FORMAT,
        _USER,
        Field(
            name="dimensions",
            rule=Count(dimensions=True),
            doc="Keep the first N values, renormalised: one of the dimensions the model "
            "declares it was trained for (its `matryoshka_dimensions`) or its own; any N up "
            "to its own with --any-dimensions.",
        ),
        _LONG_INPUTS,
        EMBEDDING_TYPE,
    ),
    # A quantized type is answered as JSON integers: an OpenAI client would read base64 as
    # float32 (openai.py refuses the pair, naming encoding_format).
    excludes=(
        {
            "embedding_type": {"enum": list(EMBEDDING_TYPES[1:5])},
            "encoding_format": {"const": "base64"},
        },
    ),
)

#: ``POST /embeddings``: OpenAI's shape with Infinity's ``modality``, ``dimensions: 0`` and
#: empty texts.
INFINITY_EMBEDDINGS = Body(
    fields=(
        Field(
            name="modality",
            rule=Choice(values=("text",), says="'text' (this server embeds texts)"),
            doc="Only texts are embedded here.",
        ),
        Field(
            name="model",
            rule=Name(nonempty=True),
            doc="A served model; with one model served, any name (and "
            "`default/not-specified`, what infinity_client sends) is that model, as Infinity "
            "resolves it.",
        ),
        _embedding_input(allow_empty=True),
        _FORMAT,
        _USER,
        Field(
            name="dimensions",
            rule=Count(dimensions=True, zero_is_none=True),
            doc="0 or absent: the model's own (Infinity's default); else the first N values, "
            "renormalised: one of the dimensions the model declares (its "
            "`matryoshka_dimensions`) or its own; any N up to its own with --any-dimensions.",
        ),
        _LONG_INPUTS,
    )
)


# -- TEI ----------------------------------------------------------------------------------

#: Texts to embed and passages to score may be empty (pipelines send a document without
#: text as ``""``); a query, a text to classify or compare may not.
_TEXT = Text()
_TRUNCATE = Field(name="truncate", rule=Flag(), default=True)
_DIRECTION = Field(
    name="truncation_direction",
    rule=Choice(values=("Right", "right"), says="'Right' (left truncation is not offered)"),
    documented=False,
)
_DIMENSIONS = Field(
    name="dimensions",
    rule=Count(dimensions=True),
    doc="Keep the first N values: one of the dimensions the model declares (its "
    "`matryoshka_dimensions`) or its own; any N up to its own with --any-dimensions.",
)
_PROMPT = Field(name="prompt_name", rule=PromptName())
_MODEL = Field(name="model", rule=Name(strict=False), documented=False)

#: TEI's ``parameters`` of ``/embed`` and ``/similarity``: fields that override the body's.
EMBED_PARAMETERS = Body(
    fields=(
        _DIRECTION,
        Field(name="truncate", rule=Flag()),
        Field(name="normalize", rule=Flag()),
        _DIMENSIONS,
        _PROMPT,
    ),
    nullable=True,
    doc="TEI's fields, also read here (`truncate`, `normalize`, `dimensions`, `prompt_name`).",
    message="parameters must be an object",
    prefixed=False,
    overrides=True,
)
_PARAMETERS = Field(name="parameters", rule=EMBED_PARAMETERS)

#: TEI's ``inputs`` of ``/embed``, ``/embed_sparse`` and ``/embed_all``: a text or a list of texts.
_TEI_INPUTS = Field(
    name="inputs",
    rule=OneOrMany(empty=True),
    required=True,
    missing="inputs is required: a string or a list of strings",
)

#: ``POST /embed``.
EMBED = Body(
    fields=(
        _TEI_INPUTS,
        _DIRECTION,
        _TRUNCATE,
        Field(name="normalize", rule=Flag(), default=True),
        _DIMENSIONS,
        _PROMPT,
        _PARAMETERS,
        _MODEL,
        _LONG_INPUTS,
        EMBEDDING_TYPE,
    )
)

#: ``POST /embed_sparse``: TEI's ``EmbedSparseRequest``.
EMBED_SPARSE = Body(fields=(_TEI_INPUTS, _DIRECTION, _TRUNCATE, _PROMPT, _MODEL))

#: ``POST /embed_all`` (a multi-vector model: one vector per kept token).
EMBED_ALL = Body(
    fields=(
        _TEI_INPUTS,
        _DIRECTION,
        _TRUNCATE,
        Field(
            name="is_query",
            rule=Flag(),
            default=False,
            doc="encode the inputs as queries (the folder's query marker, expanded with "
            "[MASK] to its query_length, every token kept) rather than as documents (the "
            "document marker, padding and skiplist tokens dropped), as PyLate's "
            "encode(is_query=...) does",
        ),
        _MODEL,
    )
)

_SIMILARITY_INPUTS = Body(
    fields=(
        Field(name="source_sentence", rule=_TEXT, required=True),
        Field(name="sentences", rule=Texts(), required=True),
    ),
    message="inputs must be an object {source_sentence, sentences}",
)

#: ``POST /similarity``.
SIMILARITY = Body(
    fields=(
        Field(name="inputs", rule=_SIMILARITY_INPUTS, required=True),
        _PARAMETERS,
        Field(name="truncate", rule=Flag(), default=True, documented=False),
        _DIRECTION,
    )
)

#: ``POST /``: the model's own task (its body is read as that task's).
ROOT = Body(
    fields=(
        Field(
            name="inputs",
            rule=Custom(
                read=lambda value, where, limits: value,
                shape=lambda served: {
                    "oneOf": [
                        *EMBED["inputs"].schema(served)["oneOf"],
                        _SIMILARITY_INPUTS.schema(served),
                    ]
                },
            ),
            required=True,
        ),
        Field(name="parameters", rule=Body(fields=(), nullable=True)),
    )
)

#: ``POST /rerank`` with ``texts``.
TEI_RERANK = Body(
    fields=(
        Field(name="model", rule=Name(strict=False)),
        Field(name="query", rule=_TEXT, required=True),
        Field(
            name="texts",
            rule=Texts(empty=True),
            required=True,
            missing="texts is required: a list of strings",
        ),
        _DIRECTION,
        _TRUNCATE,
        Field(name="raw_scores", rule=Flag(), default=False),
        Field(name="return_text", rule=Flag(), default=False),
    )
)


def predict_inputs(value: Any, limits: RequestLimits) -> tuple[list[Any], bool]:
    """TEI's ``inputs`` of ``/predict``: the items and whether it was a single input.

    A string is one text; ``[a]`` one text and ``[a, b]`` one pair; a list of lists is a
    batch of those.

    Raises:
        ApiError: any other shape, naming where.
    """
    if isinstance(value, str):
        return [check_text(value, "inputs", limits)], True
    if not isinstance(value, list):
        raise ApiError(
            "invalid",
            "inputs must be a string, a pair [string, string] or a batch "
            f"[[string], [string, string], ...], got {type(value).__name__}",
            param="inputs",
        )
    if not value:
        raise ApiError("empty", "inputs must not be empty", param="inputs")
    if isinstance(value[0], str):
        return [_sequence(value, "inputs", limits)], True
    check_count(len(value), "inputs", limits)
    return [_sequence(v, f"inputs[{i}]", limits) for i, v in enumerate(value)], False


def _sequence(value: Any, where: str, limits: RequestLimits) -> Any:
    if not isinstance(value, list) or len(value) not in (1, 2):
        raise ApiError(
            "invalid", f"{where} must be [string] or a pair [string, string]", param=where
        )
    texts = [check_text(v, f"{where}[{i}]", limits) for i, v in enumerate(value)]
    return texts[0] if len(texts) == 1 else (texts[0], texts[1])


def _predict_shape(served: Served) -> dict[str, Any]:
    text = _TEXT.schema(served)
    pair = {"type": "array", "items": text, "minItems": 1, "maxItems": 2}
    return {"oneOf": [text, pair, {"type": "array", "items": pair, "minItems": 1}]}


#: ``POST /predict``: ``inputs`` read as ``(items, single)``.
PREDICT = Body(
    fields=(
        Field(
            name="inputs",
            rule=Custom(
                read=lambda value, where, limits: predict_inputs(value, limits),
                shape=_predict_shape,
            ),
            required=True,
            missing="inputs is required",
        ),
        _DIRECTION,
        Field(name="truncate", rule=Flag(), default=True, documented=False),
        Field(name="raw_scores", rule=Flag(), default=False),
    )
)


def _tokenize_inputs(value: Any, where: str, limits: RequestLimits) -> list[Any]:
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        value = [[v] for v in value]  # TEI: a list of strings is a batch of texts
    return predict_inputs(value, limits)[0]


#: ``POST /tokenize``: ``inputs`` read as the items.
TOKENIZE = Body(
    fields=(
        Field(
            name="inputs",
            rule=Custom(read=_tokenize_inputs, shape=OneOrMany().schema),
            required=True,
            missing="inputs is required",
        ),
        Field(name="add_special_tokens", rule=Flag(), default=True),
    )
)


def _ids(ids: Any, where: str, limits: RequestLimits) -> list[list[int]]:
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        batch = [ids]
    elif isinstance(ids, list) and ids and all(isinstance(i, list) for i in ids):
        batch = ids
    else:
        raise ApiError("invalid", "ids must be a list of integers or a list of such lists", "ids")
    for i, row in enumerate(batch):
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in row):
            raise ApiError("invalid", f"ids[{i}] must hold integers >= 0", param="ids")
    return batch


def _ids_shape(served: Served) -> dict[str, Any]:
    row = {"type": "array", "items": {"type": "integer", "minimum": 0}}
    return {"oneOf": [{**row, "minItems": 1}, {"type": "array", "items": row, "minItems": 1}]}


#: ``POST /decode``: ``ids`` (a list, or a list of lists) read as a batch of rows.
DECODE = Body(
    fields=(
        Field(
            name="ids",
            rule=Custom(
                read=_ids,
                shape=_ids_shape,
            ),
            required=True,
        ),
        Field(name="skip_special_tokens", rule=Flag(), default=True, documented=False),
    )
)


# -- Cohere, Jina and Infinity ------------------------------------------------------------


def _documents_shape(served: Served) -> dict[str, Any]:
    return {
        "type": "array",
        "minItems": 1,
        "items": {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "description": "A document of string fields: its `text` is ranked, or "
                    "with `rank_fields` those fields.",
                    "additionalProperties": {"type": "string"},
                },
            ]
        },
    }


def _rank_fields(value: Any, where: str, limits: RequestLimits) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ApiError(
            "invalid",
            f"rank_fields must be a non-empty list of field names, got {value!r}",
            param="rank_fields",
        )
    return value


def _ranking(documents: Field, *more: Field, return_documents: bool) -> Body:
    # The fields every rerank shape of a query and documents shares, in the order read.
    return Body(
        fields=(
            Field(name="query", rule=_TEXT, required=True),
            documents,
            *more,
            Field(name="model", rule=Name()),
            Field(name="max_tokens_per_doc", rule=Count()),
            Field(name="max_chunks_per_doc", rule=Count()),
            Field(name="top_n", rule=Count()),
            Field(name="return_documents", rule=Flag(), default=return_documents),
            Field(name="raw_scores", rule=Flag(), default=False, documented=more == ()),
        )
    )


_MISSING_DOCUMENTS = "documents is required: a list of strings"

#: Cohere's and Jina's documents: strings or objects of strings, read by the parser with
#: ``rank_fields`` (which fields of an object are ranked).
_COHERE_DOCUMENTS = Field(
    name="documents",
    rule=Custom(read=lambda value, where, limits: value, shape=_documents_shape),
    required=True,
    missing=_MISSING_DOCUMENTS,
)
_RANK_FIELDS = Field(
    name="rank_fields",
    rule=Custom(
        read=_rank_fields,
        shape=lambda served: {
            "type": ["array", "null"],
            "items": _TEXT.schema(served),
            "minItems": 1,
        },
    ),
)

#: ``POST /v2/rerank`` (Cohere v2).
COHERE_V2_RERANK = _ranking(_COHERE_DOCUMENTS, _RANK_FIELDS, return_documents=False)
#: ``POST /v1/rerank`` (Cohere v1, Jina).
COHERE_V1_RERANK = _ranking(_COHERE_DOCUMENTS, _RANK_FIELDS, return_documents=True)
#: ``POST /rerank`` with ``documents`` (Infinity).
INFINITY_RERANK = _ranking(
    Field(name="documents", rule=Texts(empty=True), required=True, missing=_MISSING_DOCUMENTS),
    return_documents=False,
)

#: ``POST /classify`` (Infinity).
CLASSIFY = Body(
    fields=(
        Field(
            name="input",
            rule=OneOrMany(),
            required=True,
            missing="input is required: a list of strings",
        ),
        Field(name="raw_scores", rule=Flag(), default=False),
        Field(name="model", rule=Name(strict=False), documented=False),
    )
)


# -- Cohere's embed -----------------------------------------------------------------------

#: Cohere's ``input_type``: each read as one of the folder's prompts (``image``: refused).
INPUT_TYPES = ("search_document", "search_query", "classification", "clustering")

_EMBEDDING_TYPES_DOC = (
    "One or more of `float`, `int8`, `uint8`, `binary`, `ubinary`, `base64`; an answer "
    "holds one list per type. int8/uint8: each dimension scaled on the range the model's "
    "vectors of the shipped calibration texts span (calibrated at load, as "
    "sentence-transformers' `quantize_embeddings(..., calibration_embeddings=...)`); "
    "binary/ubinary: one bit per dimension (> 0), packed 8 to a byte as "
    "`quantize_embeddings` packs them (binary: the byte less 128)."
)


def _embed_body(*more: Field, types_default: list[str] | None) -> Body:
    # The fields of Cohere's v1 and v2 embed, in the order read.
    return Body(
        fields=(
            Field(
                name="texts",
                rule=Texts(empty=True),
                required=True,
                missing="texts is required: a list of strings (images are not embedded here)",
            ),
            Field(name="model", rule=Name()),
            Field(
                name="input_type",
                rule=Choice(values=INPUT_TYPES, says=", ".join(repr(v) for v in INPUT_TYPES)),
                doc="Read as the folder's prompt of that name, else the one "
                "sentence-transformers' `encode_query` (`query`) or `encode_document` "
                "(`document`, `passage`, `corpus`) uses; a type the folder has no prompt "
                "for: its default prompt. `image` is refused.",
            ),
            Field(
                name="embedding_types",
                rule=Choices(
                    values=EMBEDDING_TYPES,
                    says=", ".join(repr(v) for v in EMBEDDING_TYPES),
                    calibrated=_CALIBRATED,
                ),
                default=types_default,
                doc=_EMBEDDING_TYPES_DOC,
            ),
            Field(
                name="truncate",
                rule=Choice(values=("NONE", "START", "END"), says="'NONE', 'START' or 'END'"),
                default="END",
                states_default=True,
                doc="An input over the model's window: `END` cuts its end, `START` its start "
                "(to at most the window), `NONE` refuses it (413, naming it).",
            ),
            *more,
        )
    )


#: ``POST /v2/embed`` (Cohere v2).
COHERE_V2_EMBED = _embed_body(
    Field(
        name="output_dimension",
        rule=Count(dimensions=True),
        doc="Keep the first N values, renormalised (as OpenAI's `dimensions`); at most the "
        "model's own dimension.",
    ),
    types_default=["float"],
)
#: ``POST /v1/embed`` (Cohere v1): no ``embedding_types`` answers ``embeddings_floats``.
COHERE_V1_EMBED = _embed_body(types_default=None)


# -- KServe v2 infer ----------------------------------------------------------------------
# The fields around the tensors; a tensor's own (its data against its shape and datatype,
# its binary data's size) are read by protocols.kserve and protocols.tensors.

#: At most this many tensors in ``inputs`` (or ``outputs``) of one request: each costs the
#: event loop some work to decode, so a body of a hundred thousand tiny tensors must be
#: refused before it is decoded.
MAX_TENSORS = 256


def tensor_parameters(spec: dict[str, Any], where: str) -> dict[str, Any]:
    """A tensor's (or an output's) ``parameters``: an object, or none.

    Raises:
        ApiError: ``invalid`` naming ``where``.
    """
    params = spec.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ApiError(
            "invalid",
            f"{where}.parameters must be an object, got {type(params).__name__}",
            param=f"{where}.parameters",
        )
    return params


def prompt_param(value: Any) -> str | None:
    """``parameters.prompt_name``: the name of one of the model's prompts; None when not given.

    Raises:
        ApiError: ``invalid`` for anything but a non-empty string.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ApiError(
            "invalid",
            f"parameters.prompt_name must be the name of one of the model's prompts (a "
            f"string), got {value!r:.40}",
            param="parameters.prompt_name",
        )
    return value


def priority_param(value: Any) -> int | str | None:
    """``parameters.priority``: a level (an integer) or a class name; None when not given.

    Raises:
        ApiError: ``invalid`` for any other value.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ApiError(
            "invalid",
            f"parameters.priority must be an integer level or a class name, got {value!r:.40}",
            param="parameters.priority",
        )
    return value


def _requested_outputs(value: Any, where: str, limits: RequestLimits) -> dict[str, bool]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise ApiError("invalid", "outputs must be a list", param="outputs")
    if len(value) > MAX_TENSORS:
        raise ApiError(
            "too_large",
            f"outputs must hold at most {MAX_TENSORS} tensors, got {len(value)}",
            param="outputs",
        )
    out = {}
    for i, spec in enumerate(value):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ApiError("invalid", "each of outputs must have a string name", param="outputs")
        out[spec["name"]] = tensor_parameters(spec, f"outputs[{i}]").get("binary_data") is True
    return out


def timeout_param(value: Any) -> float | None:
    """``parameters.timeout`` (microseconds, as Triton reads it) in seconds; None: not given.

    Raises:
        ApiError: ``invalid`` unless it is a finite number > 0.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ApiError(
            "invalid",
            f"parameters.timeout must be a number of microseconds > 0, got {value!r}",
            param="parameters.timeout",
        )
    try:
        seconds = float(value) / 1e6
    except OverflowError:  # an integer too large for a float
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ApiError(
            "invalid",
            f"parameters.timeout must be finite, got {value!r:.40}",
            param="parameters.timeout",
        )
    return seconds


def _infer_inputs(value: Any, where: str, limits: RequestLimits) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise ApiError("invalid", "inputs must be a non-empty list of tensors", param="inputs")
    if len(value) > MAX_TENSORS:
        raise ApiError(
            "too_large",
            f"inputs must hold at most {MAX_TENSORS} tensors, got {len(value)}",
            param="inputs",
        )
    return value


_TENSOR = {"$ref": "#/components/schemas/Tensor"}

#: ``POST /v2/models/{name}/infer``: ``inputs`` read as the tensors' specs, decoded by the
#: parser; ``parameters.timeout`` read in seconds.
INFER = Body(
    fields=(
        Field(
            name="parameters",
            rule=Body(
                fields=(
                    Field(
                        name="timeout",
                        rule=Custom(
                            read=lambda value, where, limits: timeout_param(value),
                            shape=lambda served: {"type": "integer"},
                        ),
                        doc="Timeout in microseconds, as Triton reads it.",
                    ),
                    Field(
                        name="priority",
                        rule=Custom(
                            read=lambda value, where, limits: priority_param(value),
                            shape=lambda served: {
                                "oneOf": [{"type": "integer"}, {"type": "string"}]
                            },
                        ),
                        doc="Class of work, as Triton's priority: a level (1 = the first "
                        "class, 0 = the default) or a class name. Read only by models with "
                        "classes; takes precedence over `X-Priority`.",
                    ),
                    Field(
                        name="binary_data_output",
                        # Anything but true is false, as Triton reads it.
                        rule=Custom(
                            read=lambda value, where, limits: value is True,
                            shape=lambda served: {"type": "boolean"},
                        ),
                        default=False,
                    ),
                    Field(
                        name="prompt_name",
                        rule=Custom(
                            read=lambda value, where, limits: prompt_param(value),
                            shape=PromptName(nullable=False).schema,
                        ),
                    ),
                    Field(
                        name="is_query",
                        rule=Flag(),
                        doc="A multi-vector (ColBERT) model's texts are encoded as queries "
                        "(default: as documents), as `/embed_all`'s `is_query`.",
                    ),
                ),
                message="parameters must be an object",
            ),
        ),
        Field(
            name="inputs",
            rule=Custom(
                read=_infer_inputs,
                shape=lambda served: {
                    "type": "array",
                    "items": _TENSOR,
                    "minItems": 1,
                    "maxItems": MAX_TENSORS,
                },
            ),
            required=True,
        ),
        Field(
            name="outputs",
            rule=Custom(
                read=_requested_outputs,
                shape=lambda served: {
                    "type": "array",
                    "maxItems": MAX_TENSORS,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "parameters": {
                                "type": "object",
                                "properties": {"binary_data": {"type": "boolean"}},
                            },
                        },
                    },
                },
            ),
        ),
        Field(
            name="id",
            rule=Custom(
                read=lambda value, where, limits: value if isinstance(value, str) else None,
                shape=lambda served: {"type": "string"},
            ),
        ),
    ),
    message="body must be a JSON object",
)
