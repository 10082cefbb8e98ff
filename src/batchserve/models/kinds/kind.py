"""What a kind of model is: the value each kind's module makes once.

A :class:`Kind` owns everything the server needs to know of a kind: what one of its items
is, what its head answers (:data:`Head`), the activation of that answer, what it is warmed
up with, the routes and tasks it answers, whether its texts take a folder's prompts, and
how its quality gate judges an engine. The protocols, the registry and the operations views
read these fields; none of them names a kind. Where code must tell heads apart (a wire
format has one shape per head), it matches over :data:`Head`'s closed set, which mypy
proves exhaustive, so a new head is a type error everywhere it must be answered; a new kind
with a known head is its own module and nothing else.

Kinds compare by identity: there is one value per kind (:mod:`batchserve.models.kinds`'
``EMBEDDING``, ``RERANKER``, ``CLASSIFIER``, ``GENERIC``, ``SPARSE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from batchserve.models.kinds.activation import NONE, Activation, Floats

__all__ = [
    "WARMUP_TEXT",
    "GateName",
    "Head",
    "Kind",
    "KindName",
    "Logits",
    "Sparse",
    "Tensors",
    "Tokens",
    "Unit",
    "Vector",
]

#: A kind's name: what the wire, the configuration and ``/status`` call it.
KindName: TypeAlias = Literal[
    "embedding", "reranker", "classifier", "generic", "sparse", "multivector"
]
#: What one item is, the unit items are counted in: a text, or a (query, passage) pair.
Unit: TypeAlias = Literal["text", "pair"]
#: What an exported engine of a kind is held to by its quality gate (see :class:`Kind`).
GateName: TypeAlias = Literal["cosine", "order", "label"]

#: The text a model is warmed up with (a pair: the text twice).
WARMUP_TEXT = "A short sentence to warm the model up before serving."


@dataclass(frozen=True, slots=True, kw_only=True)
class Vector:
    """A head that answers one float vector per item, of the model's dimension.

    Attributes:
        output: what the vector is called (KServe's output tensor).
    """

    output: str = "embedding"


@dataclass(frozen=True, slots=True, kw_only=True)
class Logits:
    """A head that answers logits per item: one per label (``id2label``, in order).

    Attributes:
        output: what the activated logits are called (KServe's output tensor).
    """

    output: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Tensors:
    """No head the server knows: whatever the model's function returns, stacked as it is.

    Attributes:
        output: what a single stacked output is called (KServe's output tensor).
    """

    output: str = "output"


@dataclass(frozen=True, slots=True, kw_only=True)
class Sparse:
    """A head that answers one weight per vocabulary term per item, most of them zero.

    The row is the vocabulary's width (a SPLADE vector); the protocols send its nonzero
    terms (TEI's ``[{index, value}]``) or the whole row (KServe's tensor).

    Attributes:
        output: what the row is called (KServe's output tensor).
    """

    output: str = "sparse_embedding"


@dataclass(frozen=True, slots=True, kw_only=True)
class Tokens:
    """A head that answers one vector per kept token of each item (a multi-vector model).

    An item's row is packed (:func:`batchserve.models.kinds.multivector.unpack` reads it):
    its kept tokens, the dimension, then the vectors, token by token.

    Attributes:
        output: what the padded vectors are called (KServe's output tensor).
        counts: what each item's number of kept tokens is called (KServe's output tensor).
    """

    output: str = "token_embeddings"
    counts: str = "token_counts"


#: Every head there is; a ``match`` over it is exhaustive (``assert_never`` in its last case).
Head: TypeAlias = Vector | Logits | Tensors | Sparse | Tokens


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Kind:
    """One kind of model, and everything that kind means.

    Attributes:
        name: its name (:data:`KindName`): ``/status``'s, the metrics' and the wire's.
        item: what one item is, the unit every count of items and every rate of the
            operations views is in (None: whatever the model's function takes).
        head: what the model answers per item.
        activation: what turns its answer into the scores a client is sent by default.
        prompts: whether its texts take the folder's named prompts, prepended as
            ``SentenceTransformer.encode`` does.
        warmup: the item it is warmed up with, to measure a pass before serving (None:
            not warmed up).
        routes: the routes it answers, the first being the one an error about a route
            of another kind points to.
        tasks: the tasks it answers, in Infinity's words (its ``capabilities``).
        gate: what the quality gate holds an exported engine of this kind to: ``cosine``
            (each vector's to the reference, :mod:`batchserve.engines.quality`), ``order``
            (each query's ranking of its passages) or ``label`` (each text's top label;
            both :mod:`batchserve.engines.ranking_gate`); None: no exported engine is
            gated for it (torch alone serves it, or it runs on no engine).
    """

    name: KindName
    item: Unit | None
    head: Head
    activation: Activation
    prompts: bool = False
    warmup: Any = None
    routes: tuple[str, ...]
    tasks: tuple[str, ...] = ()
    gate: GateName | None = None

    def scoring(self, raw: bool = False) -> Activation:
        """What turns its logits into a client's scores: its activation, none when ``raw``."""
        return NONE if raw else self.activation

    def activate(self, logits: Any, raw: bool = False) -> Floats:
        """The scores of ``logits`` over their last axis: as they are when ``raw``."""
        return self.scoring(raw)(logits)

    def __repr__(self) -> str:
        return f"Kind({self.name})"
