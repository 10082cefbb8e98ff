"""The classes-of-work flags shared by ``serve`` and ``simulate``.

``--class NAME[:weight=W,share=S,timeout=T,max_wait=T]`` (repeated, most urgent first),
``--default-class NAME``, ``--tenant NAME[:weight=W]`` (repeated) and ``--tenant-share F``
build one :class:`~batchserve.policy.ClassConfig`; with no ``--class`` there is none and the
model keeps its single FIFO queue.
"""

from __future__ import annotations

import argparse

from batchserve.cli._common import falls_back
from batchserve.errors import ConfigError
from batchserve.policy import ClassConfig, Tenant, WorkClass
from batchserve.policy.classes import parse_class, parse_tenant

__all__ = ["add_class_args", "class_arg", "classes_from_args", "tenant_arg"]


def class_arg(text: str) -> WorkClass:
    """Argparse type: one ``--class`` value."""
    try:
        return parse_class(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tenant_arg(text: str) -> Tenant:
    """Argparse type: one ``--tenant`` value."""
    try:
        return parse_tenant(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_class_args(p: argparse.ArgumentParser) -> None:
    """Register ``--class``, ``--default-class``, ``--tenant`` and ``--tenant-share``."""
    g = p.add_argument_group(
        "classes of work and tenants (none: one FIFO queue)",
        "A request names its class with X-Priority (a name, or a level: 1 = first class) "
        "or KServe's parameters.priority; its tenant is its API key's name, or the "
        "X-Tenant header when keys are off.",
    )
    g.add_argument(
        "--class",
        dest="classes",
        action="append",
        type=class_arg,
        metavar="NAME[:weight=W,share=S,timeout=T,max_wait=T]",
        help="a class of work, most urgent first (repeat): its weight in every pass, its "
        "share of --queue-size, its default deadline and its max wait",
    )
    falls_back(
        g.add_argument(
            "--default-class", metavar="NAME", help="the class of requests that name none"
        ),
        "the last",
    )
    g.add_argument(
        "--tenant",
        dest="tenants",
        action="append",
        type=tenant_arg,
        metavar="NAME[:weight=W]",
        help="a tenant with a weight of its own (repeat); the only tenants metrics name",
    )
    g.add_argument(
        "--tenant-share",
        type=float,
        default=1.0,
        metavar="F",
        help="the fraction of a class's queue one tenant may hold, in (0, 1] (%(default)s)",
    )


def classes_from_args(args: argparse.Namespace) -> ClassConfig | None:
    """The classes the flags describe, or None when no ``--class`` is given.

    Raises:
        ConfigError: tenants or a default class without classes, or a bad value.
    """
    if not args.classes:
        if args.tenants or args.default_class or args.tenant_share != 1.0:
            raise ConfigError("--tenant, --tenant-share and --default-class need --class")
        return None
    return ClassConfig(
        classes=tuple(args.classes),
        default=args.default_class,
        tenants=tuple(args.tenants or ()),
        tenant_share=args.tenant_share,
    )
