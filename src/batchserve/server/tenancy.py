"""Classes of work and tenants on the wire: which class and tenant a request belongs to.

Only a model configured with classes reads any of this; a model without keeps one FIFO queue
and never looks at ``X-Priority`` (as Triton ignores a priority when no levels are set).

* The class: KServe's ``parameters.priority`` (Triton's: a level, 1 = most urgent, 0 = the
  default) when the body has one, else the ``X-Priority`` header (a class name or a level),
  else the model's default class. An unknown name or a level out of range is answered 422
  ``invalid`` naming the field and the classes allowed.
* The tenant: the name of the tenant key the request carries (``tenant_keys``), else, when
  no tenant keys are configured, the ``X-Tenant`` header (a printable name of at most 64
  characters), else none.
"""

from __future__ import annotations

import hmac

from batchserve.errors import ConfigError
from batchserve.policy import ClassConfig, WorkClass
from batchserve.server.http import Head, bearer, unauthorized
from batchserve.server.statuses import ApiError

__all__ = [
    "PRIORITY_HEADER",
    "TENANT_HEADER",
    "TenantKeys",
    "header_class",
    "resolve_class",
    "wire_tenant",
]

#: The request header naming a request's class of work.
PRIORITY_HEADER = "X-Priority"
#: The request header naming a request's tenant when no tenant keys are configured.
TENANT_HEADER = "X-Tenant"

_MAX_TENANT = 64


def resolve_class(classes: ClassConfig, priority: str | int | None, param: str) -> WorkClass:
    """The class ``priority`` names (None: the default), or 422 naming ``param``."""
    try:
        return classes.resolve(priority)
    except ConfigError as exc:
        raise ApiError("invalid", f"{param}: {exc}", param=param) from None


def header_class(classes: ClassConfig, head: Head) -> WorkClass:
    """The class the ``X-Priority`` header names (none: the default class)."""
    raw = head.get(b"x-priority")
    return resolve_class(classes, None if raw is None else raw.decode("latin-1"), PRIORITY_HEADER)


def wire_tenant(head: Head) -> str | None:
    """The tenant the ``X-Tenant`` header names, or None; 422 for a bad name."""
    raw = head.get(b"x-tenant")
    if raw is None:
        return None
    text = raw.decode("latin-1").strip()
    if not text or len(text) > _MAX_TENANT or not text.isprintable() or "," in text:
        raise ApiError(
            "invalid",
            f"{TENANT_HEADER} must be 1 to {_MAX_TENANT} printable characters without commas, "
            f"got {text[:80]!r}",
            param=TENANT_HEADER,
        )
    return text


class TenantKeys:
    """Bearer keys that name tenants; :meth:`tenant` authorizes a request and names its tenant.

    Args:
        keys: (tenant, key) pairs.
        api_key: the server's own key, accepted for requests of no tenant (None: none).
    """

    def __init__(self, keys: tuple[tuple[str, str], ...], api_key: str | None) -> None:
        self._keys = [(name, key.encode()) for name, key in keys]
        self._api_key = None if api_key is None else api_key.encode()

    def tenant(self, head: Head) -> str | None:
        """The tenant whose key the request carries (None: the server's own key).

        Raises:
            ApiError: 401 ``unauthorized`` when it carries none of the keys.
        """
        given, raw = bearer(head)
        found: str | None = None
        matched = False
        # Every key is compared (in constant time each), whichever matches.
        for name, key in self._keys:
            if raw is not None and hmac.compare_digest(raw, key):
                found, matched = name, True
        if raw is not None and self._api_key is not None:
            matched = hmac.compare_digest(raw, self._api_key) or matched
        if not matched:
            raise unauthorized(given)
        return found
