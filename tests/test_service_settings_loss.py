"""Settings named by the coordinator service come back after a data loss, also when another
process re-established the namespace first (from its defaults)."""

from __future__ import annotations

import threading
from typing import Any

from harness import wait_until

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.keys import settings_key


def _service(url: str, namespace: str, **settings: int) -> Any:
    from rcoord.service.service import CoordinatorService, ServiceConfig

    return CoordinatorService(ServiceConfig(redis_url=url, namespace=namespace, coordinator_id="s",
                                            lease_ttl_ms=1000, wake="index",
                                            settings=settings)).start()


def _lease_rounds(svc: Any, rounds: int) -> None:
    seen = {svc._last_lease_ok}

    def done() -> bool:
        seen.add(svc._last_lease_ok)
        return len(seen) > rounds

    wait_until(done, timeout_s=10)


def _named_setting_comes_back(svc: Any, client: Any, key: str, rounds: int) -> None:
    """The service's named ``group_min_session_timeout_ms`` (100) is stored and in force
    again, and still both after ``rounds`` lease rounds (no later check takes it for another
    process's change). Its settle writes the hash (``update``) a few round trips before it
    returns and its coordinator takes the config: both are waited for, not the hash alone
    (which failed about one run in eight, reading the config before the settle ended)."""
    wait_until(lambda: client.hget(key, "group_min_session_timeout_ms") == b"100"
               and svc._coord.config.group_min_session_timeout_ms == 100, timeout_s=10)
    _lease_rounds(svc, rounds)
    assert client.hget(key, "group_min_session_timeout_ms") == b"100"
    assert svc._coord.config.group_min_session_timeout_ms == 100


def _checks_held(svc: Any) -> threading.Lock:
    """A lock that, while held, holds the service's next settings check (``_check_settings``):
    what a test does under it lands between two checks."""
    check, held = svc._check_settings, threading.Lock()

    def checked() -> None:
        with held:
            check()

    svc._check_settings = checked
    return held


def test_named_settings_come_back_when_a_worker_re_established_the_namespace_first(
        redis_server, single_client, namespace):
    """The namespace is lost (a restart without persistence) and a worker, which names nothing,
    settles before the service's next lease round: it establishes the defaults at version 1.
    Before, the service took that for a change by another process (or, at the same version,
    did not notice it at all) and kept the defaults: the lowered minimum session timeout it
    names was gone for good, and members asking for it were refused."""
    key = settings_key(namespace)
    svc = _service(redis_server.url, namespace, group_min_session_timeout_ms=100)
    try:
        assert single_client.hget(key, "group_min_session_timeout_ms") == b"100"
        # The loss and the worker's settle between two checks of the service (held meanwhile).
        with _checks_held(svc):
            for k in list(single_client.scan_iter(match=f"{namespace}:*", count=1000)):
                single_client.delete(k)
            worker = GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace)).start()
            assert worker.config.group_min_session_timeout_ms == 6000
        _named_setting_comes_back(svc, single_client, key, 3)
    finally:
        svc.stop()


def test_a_count_change_left_unfinished_is_finished_by_the_service_within_a_lease_round(
        redis_server, single_client, namespace):
    """A change of the partition count whose deletion of the old layout failed leaves a mark
    (``retire:<old count>``) for the next settle to finish. Processes on the new count are
    never refused, so none settles again soon, and until one does a process still on the old
    count runs its groups there too. The service, which reads the settings every lease round,
    took no notice of the mark (the version had not moved); it now settles, which deletes the
    old layout."""
    from rcoord.keys import PartitionKeys

    GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace,
                                                      num_partitions=10)).start()
    svc = _service(redis_server.url, namespace)
    try:
        old = [PartitionKeys(namespace, p, 50).cfg for p in range(50)]
        for key in old:  # (what the failed deletion left: the old layout's copies)
            single_client.hset(key, mapping={"version": "1", "num_partitions": "50"})
        single_client.hset(settings_key(namespace), "retire:50", "1")
        # (the mark goes after the copies, in a later script: waited for, not raced)
        wait_until(lambda: not single_client.exists(*old)
                   and not single_client.hexists(settings_key(namespace), "retire:50"),
                   timeout_s=10)
        assert svc.exit_code != 3 and svc._coord.config.num_partitions == 10
    finally:
        svc.stop()


def test_a_service_whose_named_count_cannot_come_back_after_a_loss_follows_the_one_stored(
        redis_server, single_client, namespace, caplog):
    """A service named --set num_partitions=10 (a new namespace: written). The settings hash is
    lost, and a worker naming 20 settles first (re-establishing 10 from the anchors, then
    changing it, the namespace empty) and forms a group under 20. The service finds the settings
    of another origin (lost) and writes its named 10, which the group under 20 refuses. Before,
    that ConfigError was logged once and the service went on serving the 10 layout for ever,
    sweeping nothing of the groups in use; it now adopts the count stored and stops with status
    3 to be started again under it, as it does when the count changes without a loss."""
    from test_settings import FAST, _form_alone

    key = settings_key(namespace)
    svc = _service(redis_server.url, namespace, num_partitions=10)
    try:
        assert single_client.hget(key, "num_partitions") == b"10"
        with _checks_held(svc):
            single_client.delete(key)
            worker = GroupCoordinator(single_client, CoordinatorConfig(
                namespace=namespace, num_partitions=20, **FAST)).start()
            assert worker.config.num_partitions == 20
            _form_alone(worker, "g")
        wait_until(lambda: svc._stop.is_set(), timeout_s=10)
        assert svc.exit_code == 3
        assert single_client.hget(key, "num_partitions") == b"20"
        assert "settings_error" not in [getattr(r, "event", None) for r in caplog.records]
    finally:
        svc.stop()


def test_named_settings_come_back_when_the_loss_lands_inside_the_services_adoption(
        redis_server, single_client, namespace):
    """Another process changes a setting (the version moves); the service's check reads it and
    settles to adopt it; between that read and the settle's own, the namespace is lost and a
    worker naming nothing establishes the defaults. Before, the settle adopted them as the
    change it expected and took their origin for the one it knows, so no later check saw a
    loss: the lowered minimum session timeout the service names was gone for good. The settle
    returning another origin than the check read counts as a loss now."""
    key = settings_key(namespace)
    svc = _service(redis_server.url, namespace, group_min_session_timeout_ms=100)
    try:
        adopt, lost = svc._coord.resettle, threading.Event()

        def losing(*, write_named: bool = True) -> Any:
            if not write_named and not lost.is_set():
                lost.set()
                for k in list(single_client.scan_iter(match=f"{namespace}:*", count=1000)):
                    single_client.delete(k)
                GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace)).start()
            return adopt(write_named=write_named)

        with _checks_held(svc):
            svc._coord.resettle = losing
            GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace,
                                                              group_max_size=9)).start()
        wait_until(lost.is_set, timeout_s=10)
        _named_setting_comes_back(svc, single_client, key, 2)
    finally:
        svc.stop()


def test_a_search_for_left_layouts_left_unfinished_is_finished_by_the_service(
        redis_server, single_client, namespace):
    """A process re-established the lost settings (with ``sweep``: the layouts left behind are
    still to be looked for) and was killed before it looked. Processes on the count in force are
    never refused, so none settles again soon, and a process still on a layout left behind runs
    its groups there too. The service, which reads the settings every lease round, settles when
    it finds the request, which retires that layout."""
    from rcoord.keys import PartitionKeys
    from rcoord.settings import SWEEP

    GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace,
                                                      num_partitions=10)).start()
    svc = _service(redis_server.url, namespace)
    try:
        old = [PartitionKeys(namespace, p, 5).cfg for p in range(5)]
        for key in old:  # (a layout whose retire mark was lost with the settings)
            single_client.hset(key, mapping={"version": "1", "num_partitions": "5"})
        single_client.hset(settings_key(namespace), SWEEP, "1")
        wait_until(lambda: not single_client.exists(*old)
                   and not single_client.hexists(settings_key(namespace), SWEEP),
                   timeout_s=10)
        assert svc.exit_code != 3 and svc._coord.config.num_partitions == 10
    finally:
        svc.stop()
