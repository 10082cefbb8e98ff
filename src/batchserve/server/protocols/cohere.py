"""Cohere's embed API: ``POST /v2/embed`` and ``POST /v1/embed``.

The shapes are cohere-python's (``v2/raw_client.py`` ``embed``, ``raw_base_client.py``
``embed``; ``types/embed_by_type_response.py``, ``types/embed_response.py``). Each text is
one item of the batcher (:class:`~batchserve.server.protocols.tasks.Task`), batched with
everyone's; the answer is whole or refused whole.

* ``texts`` (an empty one is embedded, as TEI embeds it); ``images`` and ``inputs`` are
  refused (texts only).
* ``input_type`` is read as one of the folder's named prompts (:func:`prompt_for`): the
  prompt of that very name (``search_query``, as nomic-embed's folders name them), else
  the prompt ``SentenceTransformer.encode_query`` uses for ``search_query`` (``query``)
  and ``encode_document`` for ``search_document`` (``document``, ``passage`` or
  ``corpus``, the first the folder has); a type the folder has no prompt for (or none
  given) gets the folder's default prompt, as ``encode`` and any request naming none do;
  ``image`` is refused.
* ``embedding_types``: ``float``, ``int8``, ``uint8``, ``binary``, ``ubinary``
  (:mod:`batchserve.models.quantize`, calibrated at load), ``base64`` (the float vector's
  little-endian float32 bytes); v2's default is ``["float"]``. v1 without it answers
  ``response_type: embeddings_floats`` (a list of float vectors), with it
  ``embeddings_by_type``, as Cohere does.
* ``truncate``: ``END`` (the default, Cohere's) cuts an input's end at the model's window,
  as every route does; ``START`` cuts its start (:func:`cut_start`: the text from the first
  token that leaves it within the window, the prompt kept); ``NONE`` refuses an input over
  the window (413, naming ``texts[i]`` and its tokens).
* v2's ``output_dimension`` keeps the first N values, renormalised where the model's
  vectors are unit length (as OpenAI's ``dimensions``); the quantized types are calibrated
  on the calibration embeddings cut the same way.

The answer is ``{id, embeddings: {type: [...]}, texts, meta: {api_version, billed_units:
{input_tokens}}, response_type}``; the texts as sent. Errors are Cohere's ``{"message":
...}``.
"""

from __future__ import annotations

import base64
import uuid
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from batchserve.models.kinds import EMBEDDING, Prompts, apply_prompt
from batchserve.models.quantize import Precision
from batchserve.server.http import json_bytes
from batchserve.server.protocols import bodies
from batchserve.server.protocols.embedding_types import require_calibration, typed
from batchserve.server.protocols.openai import shortened
from batchserve.server.protocols.tasks import Task, TaskRequest, tokens_of
from batchserve.server.statuses import ApiError

if TYPE_CHECKING:
    from batchserve.models.loader import LoadedModel
    from batchserve.models.spare_tokenizer import SpareTokenizer
    from batchserve.server.registry import ServedModel
    from batchserve.server.settings import RequestLimits

__all__ = ["PROMPT_NAMES", "V1_EMBED", "V2_EMBED", "cut_start", "prompt_for"]

#: The prompt names an ``input_type`` is read as, in order (the folder's first one wins):
#: the type's own name, then the names ``SentenceTransformer.encode_query`` and
#: ``encode_document`` look for.
PROMPT_NAMES: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def prompt_for(prompts: Prompts | None, input_type: str | None) -> str | None:
    """The folder's prompt ``input_type`` is read as (None: the default, see the module)."""
    if prompts is None or input_type is None:
        return None
    for name in PROMPT_NAMES.get(input_type, ()):
        if name in prompts.prompts:
            return name
    return None


def _parse(data: Any, limits: RequestLimits, body: Any, version: str) -> TaskRequest:
    if isinstance(data, dict):
        for key in ("images", "inputs"):
            if data.get(key) is not None:
                raise ApiError("invalid", f"{key} are not embedded here: send texts", param=key)
        if data.get("input_type") == "image":  # Cohere's, not in the schema: never served
            raise ApiError(
                "invalid", "input_type 'image' is not embedded here: send texts", "input_type"
            )
    fields = body.read(data, limits)
    return TaskRequest(
        model=fields["model"],
        items=fields["texts"],
        truncate=True,  # NONE is refused by _prepare, in Cohere's words
        options={
            "version": version,
            "texts": fields["texts"],
            "input_type": fields["input_type"],
            "types": fields["embedding_types"],
            "truncate": fields["truncate"],
            "dimensions": fields.get("output_dimension"),
        },
    )


def _prepare(model: ServedModel, req: TaskRequest) -> None:
    # The model's part of the request: its prompt for input_type, its calibration, its
    # dimension, and the texts' starts cut to its window.
    loaded = model.loaded
    assert loaded is not None
    name = prompt_for(loaded.prompts, req.options["input_type"])
    req.options["prompt_name"] = name
    require_calibration(loaded, req.options["types"] or (), "embedding_types")
    dims, size = req.options["dimensions"], loaded.dimension
    if dims is not None and size is not None and dims > size:
        raise ApiError(
            "invalid",
            f"output_dimension must be at most the model's {size}, got {dims}",
            param="output_dimension",
        )
    match req.options["truncate"]:
        case "START":
            req.items = cut_start(loaded, req.items, name)
        case "NONE":
            _refuse_over_window(loaded, req.items, name)


def _refuse_over_window(loaded: LoadedModel, texts: list[str], prompt_name: str | None) -> None:
    window = loaded.max_input_tokens
    count = loaded.untruncated_tokens
    if window is None or count is None:
        return
    for i, n in enumerate(count(apply_prompt(texts, loaded.prompts, prompt_name))):
        if n > window:
            raise ApiError(
                "too_large",
                f"texts[{i}] is {n} tokens, over the model's window of {window}; send "
                "truncate END or START to cut it",
                param=f"texts[{i}]",
            )


def _starts(spare: SpareTokenizer, text: str) -> list[int]:
    # Where each of the text's tokens starts (no special tokens), on the model's spare copy.
    with spare.held() as tokenizer:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [start for start, _ in enc["offset_mapping"]]


def cut_start(loaded: LoadedModel, texts: list[str], prompt_name: str | None) -> list[str]:
    """``texts`` with the start of each one over the window cut (Cohere's ``START``).

    A text whose prompted form is over the model's window loses its first tokens: it is
    cut where the first token that leaves it within the window starts (checked with the
    model's own count of the prompted text; a cut inside a word, whose rest tokenizes to
    more tokens, moves on a token), so the model sees its end whole. The prompt is kept.
    A model that cannot count tokens is sent the texts as they are (its window cuts their
    end). Tokenizes on the event loop, as ``truncate: false`` does on every route.
    """
    window = loaded.max_input_tokens
    count = loaded.untruncated_tokens
    spare = loaded.spare_tokenizer
    if window is None or count is None or spare is None or not texts:
        return texts
    prompts = loaded.prompts

    def prompted(text: str) -> str:
        return apply_prompt([text], prompts, prompt_name)[0]

    counts = count([prompted(t) for t in texts])
    out = list(texts)
    for i, n in enumerate(counts):
        if n <= window:
            continue
        text = texts[i]
        starts = _starts(spare, text)
        j, step, tries = n - window, 1, 0
        while j < len(starts):
            if count([prompted(text[starts[j] :])])[0] <= window:
                break
            tries += 1
            j += step
            step *= 2 if tries >= 4 else 1  # a text that keeps missing is not tried per token
        out[i] = text[starts[j] :] if j < len(starts) else ""
    return out


def _embeddings(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> dict[str, Any]:
    loaded = model.loaded
    assert loaded is not None
    dims = req.options["dimensions"]
    unit = loaded.normalized is not False  # not known (None): renormalised, as OpenAI's
    transform = shortened(dims, normalized=unit)
    rows = np.asarray(outputs, dtype=np.float32).reshape(len(outputs), -1)
    vectors = transform(rows) if dims is not None else rows
    out: dict[str, Any] = {}
    for kind in req.options["types"] or ("float",):
        if kind == "base64":
            out[kind] = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
        else:
            key = ("cohere", dims, unit) if dims is not None else None
            cut = transform if dims is not None else None
            precision = cast(Precision, kind)  # checked by the body's rule
            out[kind] = typed(loaded, vectors, precision, key=key, transform=cut).tolist()
    return out


def _meta(version: str, tokens: int) -> dict[str, Any]:
    return {"api_version": {"version": version}, "billed_units": {"input_tokens": tokens}}


def _answer(model: ServedModel, req: TaskRequest, outputs: list[Any]) -> bytes:
    embeddings = _embeddings(model, req, outputs)
    floats = req.options["types"] is None  # v1 without embedding_types
    return json_bytes(
        {
            "response_type": "embeddings_floats" if floats else "embeddings_by_type",
            "id": str(uuid.uuid4()),
            "embeddings": embeddings["float"] if floats else embeddings,
            "texts": req.options["texts"],
            "meta": _meta(req.options["version"], tokens_of(model, req.items)),
        }
    )


V2_EMBED = Task(
    route="POST /v2/embed",
    kinds=(EMBEDDING,),
    parse=lambda data, limits: _parse(data, limits, bodies.COHERE_V2_EMBED, "2"),
    answer=_answer,
    field="texts",
    prepare=_prepare,
    dimensions_field="output_dimension",
)
V1_EMBED = Task(
    route="POST /v1/embed",
    kinds=(EMBEDDING,),
    parse=lambda data, limits: _parse(data, limits, bodies.COHERE_V1_EMBED, "1"),
    answer=_answer,
    field="texts",
    prepare=_prepare,
    dimensions_field="output_dimension",
)
