"""``stop()`` after a ``start()`` that failed on its own (a caller's ``finally``; a program's
signal handler that runs ``stop()`` on the start's thread just after the start's ``finally``,
as the failure leaves it): the start shut down what it opened, so the stop has nothing left to
do. It shut down a second time, and logged "coordinator stopped" for a service that never
started."""

from __future__ import annotations

import logging
import socket

import pytest
from harness import EventLog, handling

from rcoord.errors import ConfigError
from rcoord.service.service import CoordinatorService, ServiceConfig


def test_a_stop_after_a_failed_start_does_nothing_and_logs_nothing(own_server, namespace):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    svc = CoordinatorService(ServiceConfig(redis_url=own_server.url, namespace=namespace,
                                           coordinator_id="failed", lease_ttl_ms=2000,
                                           metrics_port=port))
    try:
        with handling(EventLog(), "rcoord", logging.DEBUG) as log:
            with pytest.raises(ConfigError, match="metrics port"):
                svc.start()
            before = list(log.seen)
            svc.stop()  # on the start's thread, as a signal handler would run it
            svc.stop()
        assert log.seen == before, log.seen[len(before):]
        assert "stopped" not in log.seen
    finally:
        taken.close()
