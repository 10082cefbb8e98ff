"""The inference routes, one row each: path, method, endpoint, kinds, body and documentation.

Theory of operation: :data:`INFERENCE` is the one table of the routes that are carried as
inference exchanges (:mod:`batchserve.server.exchange`). The application builds each row's
endpoint (:meth:`Route.build`) and answers the row's method on its path with it; the
routes that are not inference (:mod:`batchserve.server.routes`) answer 405 on these paths
from the same rows; the OpenAPI document (:mod:`batchserve.server.ops.openapi`) writes
each row's operation from its summary, description, body and error shape. Which kinds of
model a path answers is read from the kinds' own table
(:data:`batchserve.models.kinds.ROUTES`), through :func:`kinds_of` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchserve.models.kinds import BY_NAME, Kind
from batchserve.server.protocols import bodies, infinity, kserve, openai, rerankers, tei
from batchserve.server.protocols.cohere import V1_EMBED, V2_EMBED
from batchserve.server.protocols.fields import Body, Either
from batchserve.server.protocols.tasks import Task, TaskEndpoint

if TYPE_CHECKING:
    from batchserve.server.exchange import Endpoint
    from batchserve.server.registry import Registry
    from batchserve.server.settings import RequestLimits

__all__ = ["INFER_PATH", "INFERENCE", "Route", "kinds_of"]

#: KServe's infer route; also served under ``/v2/models/{name}/versions/{version}/infer``.
INFER_PATH = "/v2/models/{name}/infer"

#: An endpoint from the served models, the limits and the kinds its path answers.
Build = Callable[["Registry", "RequestLimits", "tuple[Kind, ...] | None"], "Endpoint"]


def kinds_of(path: str, method: str = "POST") -> tuple[Kind, ...] | None:
    """The kinds of model that answer ``method path``, in order of preference; None: any.

    Read from the kinds' own routes (:attr:`~batchserve.models.kinds.Kind.routes`). A kind
    that lists the route earlier among its own comes first (``/predict`` is a classifier's
    first route and one a reranker also answers: a body naming no model goes to the
    classifier); then the manual's order. None for ``POST /``, where each kind answers its
    own task.
    """
    route = f"{method} {path}"
    kinds = [k for k in BY_NAME.values() if route in k.routes]
    kinds.sort(key=lambda k: k.routes.index(route))
    return tuple(kinds) or None


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One inference route.

    Attributes:
        path: its path (``{name}``: the model's, for KServe's infer).
        method: the one method it takes (another is answered 405).
        build: its endpoint, from the served models, the limits and its kinds.
        summary: its one-line title in the OpenAPI document.
        description: what it takes and answers.
        tag: its group in the document.
        error: the component that states its error body.
        body: its body's description, or the name of the component that states it.
        answer: the component that states its answer (None: a task's, not stated).
        refuses: the reasons it may refuse for beyond every inference route's (a task
            route's ``wrong_kind`` and ``empty``).
    """

    path: str
    method: str = "POST"
    build: Build
    summary: str
    description: str
    tag: str
    error: str
    body: Body | Either | str
    answer: str | None = None
    refuses: tuple[str, ...] = ()

    @property
    def is_task(self) -> bool:
        """Whether it is a task route (TEI's, Cohere's, Jina's, Infinity's rerank...)."""
        return self.answer is None

    def endpoint(self, registry: Registry, limits: RequestLimits) -> Endpoint:
        """Its endpoint for the served models."""
        return self.build(registry, limits, kinds_of(self.path, self.method))


def _task(
    choose: Task | Callable[[Any, Kind], Task],
    protocol: str,
    error_body: Callable[[Any], bytes],
) -> Build:
    # A route runs one task, or chooses one by the body and the model's kind.
    pick = (lambda data, kind: choose) if isinstance(choose, Task) else choose

    def build(
        registry: Registry, limits: RequestLimits, kinds: tuple[Kind, ...] | None
    ) -> Endpoint:
        return TaskEndpoint(
            registry, limits, choose=pick, protocol=protocol, error_body=error_body, kinds=kinds
        )

    return build


def _openai(registry: Registry, limits: RequestLimits, kinds: tuple[Kind, ...] | None) -> Endpoint:
    return openai.EmbeddingsEndpoint(registry, limits)


def _infinity(
    registry: Registry, limits: RequestLimits, kinds: tuple[Kind, ...] | None
) -> Endpoint:
    return infinity.InfinityEmbeddingsEndpoint(registry, limits)


def _infer(registry: Registry, limits: RequestLimits, kinds: tuple[Kind, ...] | None) -> Endpoint:
    return kserve.InferEndpoint(limits)


#: What a task route refuses for beyond what every inference route does.
_TASK = ("wrong_kind", "empty")

#: Every inference route, in the order the OpenAPI document lists them.
INFERENCE: tuple[Route, ...] = (
    Route(
        path="/v1/embeddings",
        build=_openai,
        summary="Embed texts (OpenAI)",
        description="Each input is batched separately and may share a forward pass with "
        "other requests; the answer keeps the input order. Works with the official `openai` "
        "client (`client.embeddings.create`).",
        tag="OpenAI",
        error="OpenAIError",
        body="EmbeddingsRequest",
        answer="EmbeddingsResponse",
    ),
    Route(
        path="/embeddings",
        build=_infinity,
        summary="Embed texts (Infinity)",
        description="Infinity's `/embeddings`: OpenAI's shape, as `/v1/embeddings`, with "
        "Infinity's `dimensions: 0` (the model's own), `modality` (`text` only), `id` and "
        "`created`; an empty text is embedded. Errors carry Infinity's `error` and FastAPI's "
        "`detail` list. For `infinity_client` and code written against an Infinity URL.",
        tag="Infinity",
        error="InfinityError",
        body="InfinityEmbeddingsRequest",
        answer="InfinityEmbeddingsResponse",
        refuses=("wrong_kind",),
    ),
    Route(
        path=INFER_PATH,
        build=_infer,
        summary="Inference (KServe v2 / Open Inference Protocol)",
        description="JSON, or JSON followed by binary tensor data (Triton's binary tensor "
        "data extension: header `Inference-Header-Content-Length`), as `tritonclient.http` "
        "sends by default. `parameters.timeout` (microseconds) and the `X-Request-Timeout` "
        "header both bound the deadline. Also served under "
        "`/v2/models/{name}/versions/{version}/...`.",
        tag="KServe",
        error="KServeError",
        body="InferRequest",
        answer="InferResponse",
    ),
    Route(
        path="/embed",
        build=_task(tei.EMBED, "tei", tei.error_body),
        summary="Embed texts (TEI)",
        description="`inputs` (a text or a list), `truncate`, `normalize` (default true: "
        "unit vectors, after `dimensions` cut them; false: the model folder's own), "
        "`dimensions` (the first N values), `prompt_name` (one of the folder's prompts; "
        "default: its default prompt). An empty text is embedded (its special tokens alone), "
        "as TEI does. An embedding model.",
        tag="TEI",
        error="TEIError",
        refuses=_TASK,
        body=bodies.EMBED,
    ),
    Route(
        path="/embed_sparse",
        build=_task(tei.EMBED_SPARSE, "tei", tei.error_body),
        summary="Sparse embeddings (TEI)",
        description="`inputs` (a text or a list), `truncate`, `prompt_name` (one of the "
        "folder's prompts; default: its default prompt) -> one list of `{index, value}` per "
        "text: its nonzero vocabulary terms, indices ascending. Each text is one item of the "
        "batcher. A sparse (SPLADE) embedder.",
        tag="TEI",
        error="TEIError",
        refuses=_TASK,
        body=bodies.EMBED_SPARSE,
    ),
    Route(
        path="/rerank",
        build=_task(rerankers.choose_rerank, "tei", rerankers.rerank_error_body),
        summary="Rerank passages (TEI; Infinity and Jina with `documents`)",
        description="`query` and `texts` (TEI: a list of `{index, score, text?}` by score), "
        "or `query` and `documents` (Infinity: `{object, results, model, usage}`). Each "
        "passage is one item of the batcher; the answer is whole or refused whole. A passage "
        "may be empty (it is scored), the query not. Errors carry TEI's `error` and "
        "FastAPI's `detail` list (Infinity's). A reranker.",
        tag="Rerank",
        error="RerankError",
        refuses=_TASK,
        body=Either(bodies=(bodies.TEI_RERANK, bodies.INFINITY_RERANK)),
    ),
    Route(
        path="/embed_all",
        build=_task(tei.EMBED_ALL, "tei", tei.error_body),
        summary="Per-token vectors (TEI; a multi-vector model)",
        description="`inputs` (a text or a list), `is_query` (default false: encoded as "
        "documents, the folder's document marker, padding and skiplist tokens dropped; true: "
        "as queries, the query marker and [MASK] expansion to `query_length`, every token "
        "kept), `truncate` -> per input, per kept token, its unit vector (`[[[float]]]`), as "
        "PyLate's `ColBERT.encode` gives them. A multi-vector (ColBERT) model.",
        tag="TEI",
        error="TEIError",
        refuses=_TASK,
        body=bodies.EMBED_ALL,
    ),
    Route(
        path="/predict",
        build=_task(tei.PREDICT, "tei", tei.error_body),
        summary="Classify texts or pairs (TEI)",
        description="`inputs`: a text, a pair, or a batch of them; `raw_scores`. A classifier "
        "(or a reranker, one label).",
        tag="TEI",
        error="TEIError",
        refuses=_TASK,
        body=bodies.PREDICT,
    ),
    Route(
        path="/similarity",
        build=_task(tei.SIMILARITY, "tei", tei.error_body),
        summary="Sentence similarity (TEI)",
        description="`inputs: {source_sentence, sentences}`: one cosine per sentence; "
        "`parameters.prompt_name`, `parameters.truncate`. An embedding model.",
        tag="TEI",
        error="TEIError",
        refuses=_TASK,
        body=bodies.SIMILARITY,
    ),
    Route(
        path="/",
        build=_task(tei.choose_root, "tei", tei.error_body),
        summary="The model's own task (TEI, Hugging Face InferenceClient)",
        description="An embedder embeds (an empty text too, as TEI does) or, with `inputs: "
        "{source_sentence, sentences}`, compares; a classifier classifies "
        "(`parameters.top_k`, `parameters.function_to_apply`; an empty text is refused); a "
        "reranker reranks.",
        tag="TEI",
        error="TEIError",
        refuses=_TASK,
        body=bodies.ROOT,
    ),
    Route(
        path="/v2/rerank",
        build=_task(rerankers.choose_cohere_v2, "cohere", rerankers.cohere_error_body),
        summary="Rerank (Cohere v2)",
        description="`model`, `query`, `documents` (an empty one is scored), `top_n`, "
        "`max_tokens_per_doc` -> `{id, results: [{index, relevance_score}], meta}`. A "
        "reranker.",
        tag="Rerank",
        error="CohereError",
        refuses=_TASK,
        body=bodies.COHERE_V2_RERANK,
    ),
    Route(
        path="/v1/rerank",
        build=_task(rerankers.choose_cohere_v1, "cohere", rerankers.cohere_jina_error_body),
        summary="Rerank (Cohere v1, Jina)",
        description="`documents` as strings (an empty one is scored) or objects of strings: "
        "their `text`, or with `rank_fields` those fields as `key: value` lines, as Cohere "
        "ranks them; `top_n`, `return_documents` (default true) -> `{id, model, results, "
        "usage, meta}`, each document as sent. Errors carry Cohere's `message` and Jina's "
        "`detail`. A reranker.",
        tag="Rerank",
        error="CohereJinaError",
        refuses=_TASK,
        body=bodies.COHERE_V1_RERANK,
    ),
    Route(
        path="/v2/embed",
        build=_task(V2_EMBED, "cohere", rerankers.cohere_error_body),
        summary="Embed texts (Cohere v2)",
        description="`texts`, `input_type` (read as the folder's prompt: see the manual), "
        "`embedding_types` (float, int8, uint8, binary, ubinary, base64; int8/uint8 "
        "calibrated at load on the shipped texts), `truncate` (END, START, NONE), "
        "`output_dimension` -> `{id, embeddings: {type: [...]}, texts, meta, "
        "response_type}`. Works with the official `cohere` client "
        "(`cohere.ClientV2(base_url=...).embed`). An embedding model.",
        tag="Cohere",
        error="CohereError",
        refuses=_TASK,
        body=bodies.COHERE_V2_EMBED,
    ),
    Route(
        path="/v1/embed",
        build=_task(V1_EMBED, "cohere", rerankers.cohere_error_body),
        summary="Embed texts (Cohere v1)",
        description="As `/v2/embed`, without `output_dimension`; no `embedding_types` "
        "answers `response_type: embeddings_floats` (`embeddings` a list of float vectors), "
        "as Cohere does. For `cohere.Client(base_url=...).embed`. An embedding model.",
        tag="Cohere",
        error="CohereError",
        refuses=_TASK,
        body=bodies.COHERE_V1_EMBED,
    ),
    Route(
        path="/classify",
        build=_task(rerankers.CLASSIFY, "infinity", rerankers.infinity_error_body),
        summary="Classify texts (Infinity)",
        description="`input` (texts), `raw_scores` -> `{object, data, model, usage}`. Errors "
        "carry Infinity's `error` and FastAPI's `detail` list. A classifier.",
        tag="Rerank",
        error="InfinityError",
        refuses=_TASK,
        body=bodies.CLASSIFY,
    ),
)
