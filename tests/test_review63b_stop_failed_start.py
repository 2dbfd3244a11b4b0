"""``stop()`` from another thread while ``start()`` waits for a claimed id: the stop ends the
wait (the start raises ``StoppedBeforeClaim``, having shut down what it opened), and then has
nothing left to do. It ran a second shut-down after that start's own, which read the last
events of a service that had none (a WARNING ``tail_failed``: "'CoordinatorService' object has
no attribute 'tail'"), released the leases again and logged "coordinator stopped" for a
service that never started."""

from __future__ import annotations

import logging
import threading

from harness import EventLog, handling, wait_until

from rcoord.scripts import Scripts
from rcoord.service.leases import LeaseKeeper, StoppedBeforeClaim
from rcoord.service.service import CoordinatorService, ServiceConfig


def test_a_stop_during_a_wait_for_a_claimed_id_stops_once_and_quietly(own_server, namespace):
    client = own_server.client()
    try:
        scripts = Scripts(client)
        scripts.load()
        holder = LeaseKeeper(client, scripts, namespace, 4, "phoenix", 60_000,
                             "elsewhere-1-0123456789ab/other")
        holder.claim_id(threading.Event())
        holder.register()
        svc = CoordinatorService(ServiceConfig(
            redis_url=own_server.url, namespace=namespace, coordinator_id="phoenix",
            lease_ttl_ms=2000, wake="index", settings={"num_partitions": 4},
            retention_check_interval_ms=0))
        raised: list[BaseException] = []

        def start() -> None:
            try:
                svc.start()
            except BaseException as exc:  # noqa: BLE001 - checked below
                raised.append(exc)

        with handling(EventLog(), "rcoord", logging.INFO) as log:
            thread = threading.Thread(target=start, daemon=True)
            thread.start()
            wait_until(lambda: "coordinator_id_held" in log.seen)
            svc.stop()
            thread.join(10)
            assert not thread.is_alive()
        assert [type(exc) for exc in raised] == [StoppedBeforeClaim]
        assert "tail_failed" not in log.seen
        assert "stopped" not in log.seen
        holder.release_all(final=True)
    finally:
        client.close()
