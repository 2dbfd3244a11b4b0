"""One Redis client per URL per Python process, shared by everything rcoord runs in it.

Spark reuses its Python workers across tasks, and a driver's sink runs once per micro-batch:
a client (and its connection pool) per call would connect again every time.
"""

from __future__ import annotations

import threading
from typing import Any

from ..client import client_from_url

__all__ = ["client_for"]

_clients: dict[str, Any] = {}
_lock = threading.Lock()


def client_for(url: str) -> Any:
    """The process's client for ``url``, created on first use."""
    with _lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = client_from_url(url)
        return client
