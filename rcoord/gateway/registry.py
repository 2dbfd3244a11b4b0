"""The APIs this gateway serves: key, version range, handler; one table, read by ApiVersions.

A handler takes the connection, the decoded request and its version, and returns the response
as plain data (``rcoord.gateway.wire.build`` makes the kio entity of that version), or None
for a request that gets no response (Produce with acks=0). The version range is what the
handler implements, never simply what kio can encode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .state import Connection

__all__ = ["REGISTRY", "Api", "Handler", "api"]

Handler = Callable[[Connection, Any, int], Awaitable["dict[str, Any] | None"]]


@dataclass(frozen=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler
    group: bool = False
    """A group API: a lost Redis connection answers COORDINATOR_NOT_AVAILABLE, so the client
    looks the coordinator up again and retries, as it does when a broker goes away."""
    offload: bool = False
    """The response can be too large to build on the event loop (Metadata of a topic with
    100,000 partitions takes seconds): ``dispatch`` builds and encodes it on the topic threads,
    so the other connections are served meanwhile. Its handler may give lists as iterators,
    which are then run there too."""


REGISTRY: dict[int, Api] = {}


def api(key: int, name: str, min_version: int, max_version: int, *, group: bool = False,
        offload: bool = False) -> Callable[[Handler], Handler]:
    """Register ``handler`` for API ``key`` at ``min_version..max_version``."""

    def register(handler: Handler) -> Handler:
        if key in REGISTRY:
            raise RuntimeError(f"API key {key} ({name}) registered twice")
        REGISTRY[key] = Api(key, name, min_version, max_version, handler, group, offload)
        return handler

    return register
