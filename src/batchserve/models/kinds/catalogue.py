"""The closed set of kinds, and what is read across them: by name, routes, units.

Every kind is listed here once (:data:`BY_NAME`, in the order the manual lists them); the
lookups below are computed from the kinds' own fields, so a new kind is its module and its
line here.
"""

from __future__ import annotations

from batchserve.models.kinds.classifier import CLASSIFIER
from batchserve.models.kinds.embedding import EMBEDDING
from batchserve.models.kinds.generic import GENERIC
from batchserve.models.kinds.kind import Kind, KindName, Unit
from batchserve.models.kinds.multivector import MULTIVECTOR
from batchserve.models.kinds.reranker import RERANKER
from batchserve.models.kinds.sparse import SPARSE

__all__ = ["BY_NAME", "ITEMS", "KINDS", "ROUTES", "item_of", "kind_named", "wrong_kind"]

#: Every kind by its name, in the order the manual lists them.
BY_NAME: dict[KindName, Kind] = {
    k.name: k for k in (EMBEDDING, RERANKER, CLASSIFIER, GENERIC, SPARSE, MULTIVECTOR)
}

_BY_STR: dict[str, Kind] = {k.name: k for k in BY_NAME.values()}

#: Every kind's name, in the manual's order (the values ``/status`` and the metrics show).
KINDS: tuple[KindName, ...] = tuple(BY_NAME)

#: The routes each kind answers (by its name), the first being the one a wrong-kind error
#: points to.
ROUTES: dict[str, tuple[str, ...]] = {name: k.routes for name, k in BY_NAME.items()}

#: Every unit :func:`item_of` names.
ITEMS: tuple[Unit, ...] = tuple(sorted({k.item for k in BY_NAME.values() if k.item is not None}))


def kind_named(name: str) -> Kind:
    """The kind called ``name``.

    Raises:
        ValueError: no kind is called so (the message names those there are).
    """
    kind = _BY_STR.get(name)
    if kind is None:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {name!r}")
    return kind


def item_of(kind: Kind | None) -> Unit | None:
    """What one item of a model of ``kind`` is: ``pair``, ``text``, or None.

    None for a kind whose items are whatever its function takes (``generic``) and for no
    kind (a model still loading).
    """
    return kind.item if kind is not None else None


def wrong_kind(name: str, kind: Kind, route: str) -> str:
    """The message of a route asked of a model of the wrong kind, naming the right route."""
    use = kind.routes[0].replace("{name}", name)
    article = "an" if kind.name[0] in "aeiou" else "a"
    return f"model {name!r} is {article} {kind.name} model and does not answer {route}; use {use}"
