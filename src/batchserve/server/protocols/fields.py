"""A request body described once: its fields, and from them its validator and its schema.

Theory of operation: a :class:`Body` is a table of :class:`Field` values (name, rule,
whether it is required, its default, its documentation). A rule is a small value with two
faces: :meth:`Rule.check` reads one value from a body's JSON and names the field and the
rule it breaks (``inputs[2] must not be an empty string``), and :meth:`Rule.schema` writes
the same rule as JSON Schema (``{"type": "string", "minLength": 1}``). :meth:`Body.read`
is the validator (the fields checked in the table's order, defaults filled in) and
:meth:`Body.schema` the body's schema in the OpenAPI document, so the parsers and the
document cannot state two rules for one field. What JSON Schema cannot say (a tensor's
data against its shape, a field that another field selects) stays in the parser that
reads the checked values.

The limits of a deployment (``--max-inputs``, ``--max-input-chars``) are checked here but
not stated as ``maxItems`` or ``maxLength``: a request over one is answered 413, like a
body over the byte limit, not 422. What a schema does state of the deployment (the served
models, their dimensions and prompts) comes in a :class:`Served`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from batchserve.server.statuses import ApiError

if TYPE_CHECKING:
    from batchserve.server.settings import RequestLimits

__all__ = [
    "Body",
    "Choice",
    "Choices",
    "Count",
    "Custom",
    "Either",
    "Field",
    "Flag",
    "Name",
    "OneOrMany",
    "PromptName",
    "Rule",
    "Served",
    "Text",
    "Texts",
    "check_text",
    "optional_bool",
    "optional_int",
    "require_object",
    "text_list",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """What a schema states of the deployment.

    Attributes:
        models: the served models' names.
        limits: the request limits (stated in words in the documentation).
        dimensions: the embedding dimensions a ``dimensions`` field takes, sorted: those the
            served models declare and their own (see
            :mod:`~batchserve.server.protocols.dimensions`).
        prompts: the prompt names the served models define, sorted.
        calibrated: whether a served embedder has calibration ranges (its int8 and uint8
            answers; :mod:`batchserve.models.quantize`): the schema lists those types only
            then, as any other is refused.
        any_prefix: a ``dimensions`` field takes any value up to the largest of
            ``dimensions`` (``--any-dimensions``, or a model that declares any prefix).
    """

    models: tuple[str, ...] = ()
    limits: RequestLimits
    dimensions: tuple[int, ...] = ()
    prompts: tuple[str, ...] = ()
    calibrated: bool = True
    any_prefix: bool = False


class Rule(Protocol):
    """One field's rule, as a check and as JSON Schema."""

    def check(self, value: Any, where: str, limits: RequestLimits) -> Any:
        """``value`` as the parser takes it.

        Raises:
            ApiError: naming ``where`` and the rule broken.
        """

    def schema(self, served: Served) -> dict[str, Any]:
        """The rule as JSON Schema."""


# -- the checks ---------------------------------------------------------------------------


def require_object(data: Any) -> dict[str, Any]:
    """``data`` if it is a JSON object.

    Raises:
        ApiError: ``invalid`` naming the body.
    """
    if not isinstance(data, dict):
        raise ApiError(
            "invalid", f"body must be a JSON object, got {type(data).__name__}", param="body"
        )
    return data


def check_text(value: Any, where: str, limits: RequestLimits, *, allow_empty: bool = False) -> str:
    """``value`` if it is a string within ``--max-input-chars`` (non-empty unless allowed).

    ``allow_empty`` is for a pipeline's documents, which may have no text (LangChain's and
    Haystack's rerankers and embedders send ``content or ""``): TEI embeds an empty text
    (its special tokens alone) and scores a pair with an empty passage rather than refuse
    the whole request.

    Raises:
        ApiError: ``invalid`` or ``too_large``, naming ``where``.
    """
    if not isinstance(value, str):
        raise ApiError(
            "invalid", f"{where} must be a string, got {type(value).__name__}", param=where
        )
    if not value and not allow_empty:
        raise ApiError("invalid", f"{where} must not be an empty string", param=where)
    if len(value) > limits.max_input_chars:
        raise ApiError(
            "too_large",
            f"{where} must be at most {limits.max_input_chars} characters "
            f"(--max-input-chars), got {len(value)}",
            param=where,
        )
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ApiError(
                "invalid", f"{where} must be valid Unicode text (a lone surrogate)", param=where
            ) from None
    return value


def text_list(
    value: Any, where: str, limits: RequestLimits, *, allow_empty: bool = False
) -> list[str]:
    """``value`` if it is a non-empty list of texts (each checked; see :func:`check_text`).

    Raises:
        ApiError: ``empty`` for an empty list, ``invalid`` or ``too_large`` otherwise.
    """
    if not isinstance(value, list):
        raise ApiError(
            "invalid",
            f"{where} must be a list of strings, got {type(value).__name__}",
            param=where,
        )
    if not value:
        raise ApiError("empty", f"{where} must not be empty", param=where)
    check_count(len(value), where, limits)
    return [
        check_text(v, f"{where}[{i}]", limits, allow_empty=allow_empty) for i, v in enumerate(value)
    ]


def check_count(n: int, where: str, limits: RequestLimits) -> None:
    """Refuse more than ``--max-inputs`` items.

    Raises:
        ApiError: ``too_large`` naming ``where``.
    """
    if n > limits.max_inputs:
        raise ApiError(
            "too_large",
            f"{where} must hold at most {limits.max_inputs} items (--max-inputs), got {n}",
            param=where,
        )


def optional_bool(data: dict[str, Any], key: str, default: bool) -> bool:
    """``data[key]`` if it is a boolean, ``default`` if absent or null.

    Raises:
        ApiError: ``invalid`` naming ``key``.
    """
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError("invalid", f"{key} must be a boolean, got {value!r}", param=key)
    return value


def optional_int(data: dict[str, Any], key: str, minimum: int = 1) -> int | None:
    """``data[key]`` if it is an integer >= ``minimum``, None if absent or null.

    Raises:
        ApiError: ``invalid`` naming ``key``.
    """
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():  # JSON's 1.0 is the integer 1
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(
            "invalid", f"{key} must be an integer >= {minimum}, got {value!r}", param=key
        )
    return value


# -- the rules ----------------------------------------------------------------------------


def _nullable(types: str) -> dict[str, Any]:
    return {"type": [types, "null"]}


@dataclass(frozen=True, slots=True, kw_only=True)
class Text:
    """A text within ``--max-input-chars``; empty only if ``empty`` (see :func:`check_text`)."""

    empty: bool = False

    def check(self, value: Any, where: str, limits: RequestLimits) -> str:
        """See :class:`Rule`."""
        return check_text(value, where, limits, allow_empty=self.empty)

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        return {"type": "string"} if self.empty else {"type": "string", "minLength": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class Texts:
    """A non-empty list of texts, at most ``--max-inputs`` (see :func:`text_list`)."""

    empty: bool = False

    def check(self, value: Any, where: str, limits: RequestLimits) -> list[str]:
        """See :class:`Rule`."""
        return text_list(value, where, limits, allow_empty=self.empty)

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        return {"type": "array", "items": Text(empty=self.empty).schema(served), "minItems": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class OneOrMany:
    """A text or a list of texts, read as a list."""

    empty: bool = False

    def check(self, value: Any, where: str, limits: RequestLimits) -> list[str]:
        """See :class:`Rule`."""
        if isinstance(value, str):
            return [check_text(value, where, limits, allow_empty=self.empty)]
        return text_list(value, where, limits, allow_empty=self.empty)

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        return {
            "oneOf": [Text(empty=self.empty).schema(served), Texts(empty=self.empty).schema(served)]
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Flag:
    """A boolean (null: the field's default)."""

    def check(self, value: Any, where: str, limits: RequestLimits) -> bool:
        """See :class:`Rule`."""
        if not isinstance(value, bool):
            raise ApiError("invalid", f"{where} must be a boolean, got {value!r}", param=where)
        return value

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        return _nullable("boolean")


@dataclass(frozen=True, slots=True, kw_only=True)
class Count:
    """An integer >= ``minimum`` (JSON's ``1.0`` is 1); null: absent.

    Attributes:
        minimum: the least value taken.
        dimensions: at most the largest dimension served (stated in the schema; the model
            asked checks its own).
        zero_is_none: 0 means absent (Infinity's ``dimensions``), though ``minimum`` is 1.
    """

    minimum: int = 1
    dimensions: bool = False
    zero_is_none: bool = False

    def check(self, value: Any, where: str, limits: RequestLimits) -> int | None:
        """See :class:`Rule`."""
        if self.zero_is_none and value == 0 and not isinstance(value, bool):
            return None
        return optional_int({where: value}, where, self.minimum)

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        out: dict[str, Any] = {
            **_nullable("integer"),
            "minimum": 0 if self.zero_is_none else self.minimum,
        }
        if self.dimensions and served.dimensions:
            if served.any_prefix or served.limits.any_dimensions:
                out["maximum"] = max(served.dimensions)
            else:  # only the values declared (null and Infinity's 0: the model's own)
                out["enum"] = [*([0] if self.zero_is_none else []), *served.dimensions, None]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """One of ``values`` (or null); ``says`` is how the message names them.

    ``calibrated`` are those of ``values`` only a calibrated deployment answers
    (:attr:`Served.calibrated`): read always (the parser refuses them naming why), stated
    in the schema only where served.
    """

    values: tuple[str, ...]
    says: str
    calibrated: tuple[str, ...] = ()

    def check(self, value: Any, where: str, limits: RequestLimits) -> str:
        """See :class:`Rule`."""
        if value not in self.values:
            raise ApiError("invalid", f"{where} must be {self.says}, got {value!r}", param=where)
        return str(value)

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        return {"enum": [*_stated(self.values, self.calibrated, served), None]}


@dataclass(frozen=True, slots=True, kw_only=True)
class Choices:
    """A non-empty list of ``values`` (Cohere's ``embedding_types``), read without repeats.

    Attributes:
        values: the values taken.
        says: how the message names them.
        calibrated: those only a calibrated deployment answers (see :class:`Choice`).
    """

    values: tuple[str, ...]
    says: str
    calibrated: tuple[str, ...] = ()

    def check(self, value: Any, where: str, limits: RequestLimits) -> list[str]:
        """See :class:`Rule`; each value once, in the order first given."""
        if not isinstance(value, list):
            raise ApiError(
                "invalid", f"{where} must be a list of {self.says}, got {value!r:.60}", where
            )
        if not value:
            raise ApiError("empty", f"{where} must not be empty", param=where)
        for i, v in enumerate(value):
            if v not in self.values:
                raise ApiError(
                    "invalid", f"{where}[{i}] must be {self.says}, got {v!r:.60}", f"{where}[{i}]"
                )
        return list(dict.fromkeys(value))

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        return {
            "type": ["array", "null"],
            "items": {"enum": _stated(self.values, self.calibrated, served)},
            "minItems": 1,
        }


def _stated(values: tuple[str, ...], calibrated: tuple[str, ...], served: Served) -> list[str]:
    # The values a schema states: those needing calibration only where it is served.
    return [v for v in values if served.calibrated or v not in calibrated]


@dataclass(frozen=True, slots=True, kw_only=True)
class Name:
    """A name: a string (non-empty if ``nonempty``), checked only if ``strict``.

    ``served``: the schema states the served models' names. TEI's routes (not ``strict``)
    read anything but a string as no name.

    A body's model name is checked as a string only: which name answers is the route's
    choice (a hosted API's client sends its own names), not a schema's.
    """

    nonempty: bool = False
    served: bool = False
    strict: bool = True

    def check(self, value: Any, where: str, limits: RequestLimits) -> str | None:
        """See :class:`Rule`; not ``strict``, anything but a string reads as no name."""
        if not self.strict:
            return value if isinstance(value, str) else None
        if not isinstance(value, str) or (self.nonempty and not value):
            rule = "a non-empty string" if self.nonempty else "a string"
            raise ApiError("invalid", f"{where} must be {rule}, got {value!r}", param=where)
        return value

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        out: dict[str, Any] = _nullable("string")
        if self.served:
            out["enum"] = [*served.models, None]
        elif self.nonempty:
            out["minLength"] = 1
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptName:
    """An embedding model's prompt name: a string checked here, one of its prompts there.

    Attributes:
        nullable: null is stated as valid (absent means the same).
    """

    nullable: bool = True

    def check(self, value: Any, where: str, limits: RequestLimits) -> str:
        """See :class:`Rule`."""
        if not isinstance(value, str):
            raise ApiError("invalid", f"{where} must be a string, got {value!r}", param=where)
        return value

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        description = (
            "An embedding model's prompt, prepended to each text: one of its folder's "
            "(`config_sentence_transformers.json`); default: its default prompt, as on every "
            "route. An unknown name (or one for another kind of model) is 422."
        )
        names: list[Any] = [*served.prompts, None] if self.nullable else list(served.prompts)
        if not names:
            return {"not": {}, "description": description + " No served model defines prompts."}
        return {"enum": names, "description": description}


@dataclass(frozen=True, slots=True, kw_only=True)
class Custom:
    """A rule whose check is a parser's own function and whose schema is stated beside it.

    For shapes a field-by-field table does not reach: a union told apart by its values
    (TEI's ``/predict`` inputs), documents that are strings or objects.
    """

    read: Callable[[Any, str, RequestLimits], Any]
    shape: Callable[[Served], dict[str, Any]]

    def check(self, value: Any, where: str, limits: RequestLimits) -> Any:
        """See :class:`Rule`."""
        return self.read(value, where, limits)

    def schema(self, served: Served) -> dict[str, Any]:
        """See :class:`Rule`."""
        return self.shape(served)


# -- fields and bodies --------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    """One field of a body.

    Attributes:
        name: its key in the body.
        rule: what its value must be.
        required: it must be given (stated in the schema).
        missing: with ``required``, the message when it is absent (``inputs is required``);
            None: an absent value is checked as null (its rule names the field).
        default: an optional field's value when absent or null.
        doc: its description in the schema, or a function of what is served (None: none).
        documented: whether the schema lists it (a field read for another server's clients
            and not offered is not).
        states_default: the schema states ``default``.
    """

    name: str
    rule: Rule
    required: bool = False
    missing: str | None = None
    default: Any = None
    doc: str | Callable[[Served], str] | None = None
    documented: bool = True
    states_default: bool = False

    def schema(self, served: Served) -> dict[str, Any]:
        """The field's schema, with its description (and its default, if it states it)."""
        out = self.rule.schema(served)
        if self.doc is not None:
            out["description"] = self.doc if isinstance(self.doc, str) else self.doc(served)
        if self.states_default:
            out["default"] = self.default
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Body:
    """A JSON object's fields (see the module docstring).

    Attributes:
        fields: in the order they are checked (the first broken rule is the one answered).
        nullable: the object may be null (a nested object, such as TEI's ``parameters``).
        doc: the object's description in the schema.
        message: the message when it is not an object (None: ``require_object``'s).
        prefixed: a nested object's errors name its fields under its own
            (``inputs.sentences``); False: by their own names, as TEI's ``parameters``.
        overrides: a nested object of fields that override the body's (TEI's
            ``parameters``): it reads as only the fields it holds, no defaults.
        excludes: combinations of values its fields may not take together (JSON
            Schema ``properties`` of the fields, all present), refused by the parser;
            stated in the schema as ``not``.
    """

    fields: tuple[Field, ...]
    nullable: bool = False
    doc: str | None = None
    message: str | None = None
    prefixed: bool = True
    overrides: bool = False
    excludes: tuple[dict[str, Any], ...] = ()
    _by_name: dict[str, Field] = field(init=False, repr=False, compare=False)
    #: What :meth:`read` reads of each field, unpacked once: it runs on every request.
    _plan: tuple[tuple[str, Callable[..., Any], bool, str | None, Any], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {f.name: f for f in self.fields})
        plan = tuple((f.name, f.rule.check, f.required, f.missing, f.default) for f in self.fields)
        object.__setattr__(self, "_plan", plan)

    def __getitem__(self, name: str) -> Field:
        """The field ``name``."""
        return self._by_name[name]

    def read(self, data: Any, limits: RequestLimits, *, where: str = "") -> dict[str, Any]:
        """The checked values of ``data``'s fields, each field's default where absent.

        Fields not described are ignored, as the original servers ignore them.

        Args:
            data: the body's JSON (or a nested object's).
            limits: the request limits.
            where: a nested object's field, prefixed to the names its errors give.

        Raises:
            ApiError: ``invalid``, ``empty`` or ``too_large``, naming the field and the rule.
        """
        if data is None and self.nullable:
            return {}
        if not isinstance(data, dict):
            if self.message is not None:
                raise ApiError("invalid", self.message, param=where or "body")
            require_object(data)
        out: dict[str, Any] = {}
        prefix = f"{where}." if where and self.prefixed else ""
        given = self.overrides
        for name, check, required, missing, default in self._plan:
            value = data.get(name)
            if value is None:
                if not required:
                    if not given:
                        out[name] = default
                    continue
                if missing is not None and name not in data:
                    raise ApiError("invalid", missing, param=prefix + name)
                # present as null, or no message of its own: its rule names the field
            out[name] = check(value, prefix + name if prefix else name, limits)
        return out

    def schema(self, served: Served) -> dict[str, Any]:
        """The body as JSON Schema (its documented fields)."""
        out: dict[str, Any] = {"type": ["object", "null"] if self.nullable else "object"}
        if self.doc is not None:
            out["description"] = self.doc
        required = [f.name for f in self.fields if f.required and f.documented]
        if required:
            out["required"] = required
        properties = {f.name: f.schema(served) for f in self.fields if f.documented}
        if properties:
            out["properties"] = properties
        nots = [{"required": sorted(e), "properties": e} for e in self.excludes]
        if len(nots) == 1:
            out["not"] = nots[0]
        elif nots:
            out["allOf"] = [{"not": n} for n in nots]
        return out

    def check(self, value: Any, where: str, limits: RequestLimits) -> dict[str, Any]:
        """A nested object as a field's rule (see :meth:`read`)."""
        return self.read(value, limits, where=where)


@dataclass(frozen=True, slots=True, kw_only=True)
class Either:
    """A body of one of several shapes, told apart by its parser (TEI's or Infinity's)."""

    bodies: tuple[Body, ...]

    def schema(self, served: Served) -> dict[str, Any]:
        """The shapes as JSON Schema's ``oneOf``."""
        return {"oneOf": [b.schema(served) for b in self.bodies]}
