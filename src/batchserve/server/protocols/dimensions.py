"""Which ``dimensions`` a request may ask of a model: the ones it was trained for.

A ``dimensions`` (OpenAI's and Infinity's ``dimensions``, TEI's, Cohere's
``output_dimension``) keeps the first N values of each vector and renormalises them. That
is a good vector only where the model was trained for it (Matryoshka training, at the
dimensions its folder declares: :mod:`batchserve.models.matryoshka`); any other prefix is
a worse vector than a smaller model's, and a client that asks for one gets no warning of
it. So, as vLLM and SGLang do, a value the model does not declare is refused (422, naming
the field and the values it declares), and a model that declares none accepts only its
own dimension. An operator who wants any prefix anyway says so: ``--any-dimensions``
(:attr:`~batchserve.server.settings.RequestLimits.any_dimensions`).

:func:`check_declared_dimensions` is the one check; each route calls it where it knows its
model, before anything is queued.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from batchserve.server.statuses import ApiError

if TYPE_CHECKING:
    from batchserve.models.loader import LoadedModel
    from batchserve.server.settings import RequestLimits

__all__ = ["allowed_dimensions", "check_declared_dimensions"]


def allowed_dimensions(loaded: LoadedModel) -> tuple[int, ...] | None:
    """The dimensions ``loaded`` accepts, ascending, its own last; None: any prefix.

    None also where its own dimension is not known (nothing to check against).
    """
    declared = loaded.matryoshka
    own = loaded.dimension
    if declared.any_prefix or own is None:
        return None
    return tuple(sorted({d for d in declared.dimensions if d <= own} | {own}))


def check_declared_dimensions(
    requested: int | None,
    loaded: LoadedModel,
    limits: RequestLimits,
    field: str = "dimensions",
) -> None:
    """Refuse a ``requested`` dimension that ``loaded`` was not trained for.

    Args:
        requested: the request's value (None: the model's own, always accepted).
        loaded: the model.
        limits: the request limits (``any_dimensions``: any prefix up to the model's own).
        field: the request's field, as the error names it (``output_dimension``).

    Raises:
        ApiError: ``invalid`` (422) naming ``field`` and the values the model declares.
    """
    if requested is None:
        return
    own = loaded.dimension
    if own is not None and requested > own:
        raise ApiError(
            "invalid",
            f"{field}={requested} is over the model's own dimension: it produces "
            f"{own}-dimensional embeddings; pass at most {own}",
            param=field,
        )
    allowed = None if limits.any_dimensions else allowed_dimensions(loaded)
    if allowed is None or requested in allowed:
        return
    values = ", ".join(str(d) for d in allowed)
    why = (
        "it declares no Matryoshka dimensions, so only its own"
        if len(allowed) == 1
        else "the dimensions it was trained for (Matryoshka)"
    )
    raise ApiError(
        "invalid",
        f"{field}={requested} is not a dimension this model declares: {field} must be one of "
        f"{values} ({why}); a prefix it was not trained for is a worse vector than a smaller "
        "model's (the operator may allow any with --any-dimensions)",
        param=field,
    )
