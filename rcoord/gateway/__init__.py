"""A Kafka protocol gateway: unmodified Kafka clients join rcoord groups and use rcoord topics.

``rcoord gateway --listen HOST:PORT --redis-url URL`` serves Kafka's wire protocol over the same
Redis state as rcoord's Python API: group requests run the same flows (``rcoord.steps``, through
``rcoord.asyncio.AsyncGroupCoordinator``), records go to and come from ``rcoord.topics``. The
gateway holds no state between requests. See docs/gateway.md for the APIs and versions served.

Modules: ``framing`` (size-prefixed frames), ``wire`` (kio entities), ``registry`` and
``dispatch`` (API table and the per-request rules), ``server`` (connections), one ``api_*``
module per family of APIs, ``cli`` (the command).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Gateway", "GatewayConfig"]


def __getattr__(name: str) -> Any:
    # Lazy, so ``rcoord.gateway.cli`` (imported by ``rcoord --help``) needs no kio.
    if name == "Gateway":
        from .server import Gateway

        return Gateway
    if name == "GatewayConfig":
        from .state import GatewayConfig

        return GatewayConfig
    raise AttributeError(name)
