"""A heartbeat while Redis is out of memory (used memory above maxmemory, noeviction).

Kafka's coordinator answers heartbeats from memory: a group log that cannot be written fails
commits and joins (COORDINATOR_NOT_AVAILABLE) but leaves every member's session alive. rcoord's
heartbeat function only moves a member's session deadline (a score of an existing entry) and
the group's published earliest deadline, so it runs under OOM too; a refused heartbeat made
every worker count its partitions lost after one session timeout of full memory, and the
first call after memory was freed expired every member of every group.
"""

from __future__ import annotations

import pytest

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, ServerUnavailable
from rcoord.protocol.offsets import TopicPartition
from rcoord.testing.embedded import EmbeddedServer

JOIN = {"protocol_type": "consumer", "protocols": [("range", b"")], "session_timeout_ms": 30_000,
        "require_known_member_id": False}


def test_a_member_heartbeats_while_redis_is_out_of_memory(own_server: EmbeddedServer) -> None:
    r = own_server.client()
    try:
        coord = GroupCoordinator(r, CoordinatorConfig(
            namespace="trouble-oom", group_initial_rebalance_delay_ms=0)).start()
        joined = coord.join_group("g", **JOIN)
        synced = coord.sync_group("g", joined.generation_id, joined.member_id,
                                  assignments={joined.member_id: b"a"})
        assert synced.error == Errors.NONE
        keys = coord._keys("g")
        before = r.zscore(keys.deadlines, f"hb:{joined.member_id}")
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", 1)
        try:
            assert coord.heartbeat("g", joined.generation_id, joined.member_id) == Errors.NONE
            assert coord.heartbeat_many([("g", joined.generation_id, joined.member_id)]) == [
                Errors.NONE]
            # (the session was refreshed; the clock is the server's, so only "not earlier")
            assert r.zscore(keys.deadlines, f"hb:{joined.member_id}") >= before
            # What grows the group's data is still refused, with the typed retriable error.
            with pytest.raises(ServerUnavailable, match="out of memory"):
                coord.commit_offsets("g", {TopicPartition("t", 0): 5},
                                     member_id=joined.member_id,
                                     generation_id=joined.generation_id)
        finally:
            r.config_set("maxmemory", 0)
        assert coord.heartbeat("g", joined.generation_id, joined.member_id) == Errors.NONE
    finally:
        r.close()
