"""Review 73 (session expiry, the deadline index, the coordinator service): reproductions.

A group whose ``expire_deadlines`` fails is backed off by the sweeper and left out of its
partition's earliest deadline (``Sweeper._refresh_node``), so the sweeper waits past its stale
index entry. But the scripts announce a deadline on the partition's shard channel only when it
is earlier than the partition's index minimum (``lua/deadline_index.lua``), and that minimum is
the backed-off group's entry: a deadline another group publishes later than that entry and
before the retry is never announced, and the sweeper learns of it only from the periodic re-read
of the index (or an expiry hint), not at the deadline. Kafka's coordinator timer reschedules a
failed timer operation by itself (``CoordinatorRuntime.EventBasedCoordinatorTimer.schedule``),
and no other timer waits for it.
"""

from __future__ import annotations

from typing import Any

from harness import WAIT_S, server_ms, wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 10_000, "rebalance_timeout_ms": 2000}


def test_a_deadline_published_behind_a_backed_off_group_reaches_the_sweeper(own_server,
                                                                            namespace):
    from rcoord.service.metrics import Metrics
    from rcoord.service.sweeper import Sweeper

    client = own_server.client()
    coord = GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, num_partitions=1, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    # A group whose every expire_deadlines fails (its record is not a hash), due in the index.
    bad = coord._keys("bad")
    client.set(bad.group, "not a hash")
    client.zadd(bad.partition.due, {"bad": server_ms(client) - 1000})
    sweeper = Sweeper(client, coord._scripts, namespace, 1, Metrics())
    sweeper.backoff_first_ms = 60_000  # its retry lies a minute ahead
    sweeper.sync_clock()
    sweeper.resync({0})
    wait_until(lambda: (0, "bad") in sweeper.backed_off,
               step=lambda: sweeper.sweep_due("deadline"), timeout_s=WAIT_S)
    retry_at = sweeper.backed_off[(0, "bad")][0]
    assert sweeper.next_due() >= retry_at  # the loop waits for the retry, as designed

    # What the service hears: the partition's shard channel (listener._run_shard).
    channel = bad.partition.due
    pubsub = client.pubsub()
    pubsub.ssubscribe(channel)
    wait_until(lambda: (m := pubsub.get_sharded_message(timeout=0.1)) is not None
               and m["type"] == "ssubscribe")
    try:
        # Another group of the partition forms; its member then goes silent. Its earliest
        # deadline (a bound no later than the member's session end, 10 s ahead) is published
        # to the index, well before the bad group's retry.
        mid = coord.join_group("good", **JOIN).member_id
        res = coord.join_group("good", mid, **JOIN)
        assert res.error == Errors.NONE
        assert coord.sync_group("good", res.generation_id, mid, assignments={}).error == Errors.NONE
        published = client.zscore(channel, "good")
        assert published is not None and published < retry_at
        # Everything the scripts sent is heard before this marker (one channel, in order).
        client.spublish(channel, "marker")
        heard: list[bytes] = []

        def hear() -> bool:
            m = pubsub.get_sharded_message(timeout=0.1)
            if m is not None and m["type"] == "smessage":
                heard.append(m["data"])
            return b"marker" in heard

        wait_until(hear)
        for data in heard[:-1]:
            sweeper.note_deadline(0, int(data))  # as CoordinatorService._handle does
    finally:
        pubsub.close()
    # The sweeper must wake for the good group's deadline; it sleeps until the bad group's
    # retry instead (or, in the service, until the next re-read of the index).
    assert sweeper.next_due() <= published, (
        f"sweeper waits until {sweeper.next_due():.0f}, {sweeper.next_due() - published:.0f} ms "
        f"past the deadline published at {published:.0f}; heard {heard}")
