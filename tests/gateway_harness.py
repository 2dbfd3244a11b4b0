"""A gateway on a free loopback port, served by its own event loop in a thread, for tests that
drive it with blocking Kafka clients (kafka-python, confluent-kafka)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.gateway import Gateway, GatewayConfig

FAST_GROUPS = {
    "group_min_session_timeout_ms": 10,
    "group_max_session_timeout_ms": 600_000,
    "group_initial_rebalance_delay_ms": 0,
}


class GatewayThread:
    """``start()`` returns once the gateway listens; ``bootstrap`` is its HOST:PORT."""

    def __init__(self, redis_url: str, namespace: str, **config: Any) -> None:
        self.config = GatewayConfig(listen_host="127.0.0.1", listen_port=0, namespace=namespace,
                                    **config)
        self.redis_url = redis_url
        self.loop = asyncio.new_event_loop()
        self.gateway: Gateway | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway",
                                        daemon=True)

    def start(self) -> GatewayThread:
        self._thread.start()
        self.gateway = Gateway(self.config, self.redis_url)
        asyncio.run_coroutine_threadsafe(self.gateway.start(), self.loop).result(30)
        return self

    @property
    def address(self) -> tuple[str, int]:
        assert self.gateway is not None
        return self.gateway.address

    @property
    def bootstrap(self) -> str:
        host, port = self.address
        return f"{host}:{port}"

    def stop(self) -> None:
        if self.gateway is not None:
            asyncio.run_coroutine_threadsafe(self.gateway.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


def settle_fast_groups(client: Any, namespace: str) -> None:
    """Name the namespace's settings (small timeouts, no initial delay) before the gateway."""
    GroupCoordinator(client, CoordinatorConfig(namespace=namespace, **FAST_GROUPS)).start()
