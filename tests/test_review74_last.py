"""Review 74: the last session's commits (d5d4e16..c09d7b4) read as a Kafka engineer would.

Each test here failed on the code it was written against (see the review's report)."""

from __future__ import annotations

from typing import Any

import pytest

TOPIC, BROKER = 2, 4
SET, DELETE = 0, 1


def test_incremental_delete_on_the_broker_is_a_no_op_as_in_kafka(gateway: Any) -> None:
    """50a8788 made a DELETE of a config rcoord does not keep nothing to do on a topic; the
    broker resource still refuses every operation. Kafka's ``ConfigAdminManager.preprocess``
    removes a DELETEd name from the broker's dynamic configs before ``DynamicBrokerConfig``
    validates what is left, and the controller records the (null) value: a DELETE of a config
    never set dynamically (a static one, or one the broker does not know) succeeds and changes
    nothing. ``kafka-configs --entity-type brokers --entity-default --alter --delete-config``
    and tools that bring a cluster to a wanted set of configs send such DELETEs."""
    pytest.importorskip("kio")
    from gateway_harness import call_once

    body = {"validate_only": False, "resources": [
        {"resource_type": BROKER, "resource_name": name, "configs": [
            {"name": n, "config_operation": DELETE, "value": None}]}
        for name, n in (("0", "log.retention.ms"), ("", "no.such.config"))]}
    answer = call_once(gateway, 44, 1, body, 5)
    got = [(r.resource_name, r.error_code.value, r.error_message) for r in answer.responses]
    assert got == [("0", 0, None), ("", 0, None)]


JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 10_000, "rebalance_timeout_ms": 2000}


def test_the_failing_sweeper_acts_on_a_deadline_published_after_its_failed_call(
        own_server: Any, namespace: str) -> None:
    """44ac6ba keeps in the due index a deadline a step of the group published after the
    failed ``expire_deadlines`` was sent (``defer_due`` moves only an entry that had passed
    then): it is the group's real earliest. But the sweeper that failed still backs the group
    off in its memory until the retry time: ``_refresh_node`` counts the entry from
    ``max(score, retry)`` and ``_waiting`` skips the group, so the lease holder (the one
    process sweeping the partition) sleeps past that real deadline, for up to BACKOFF_MAX_MS
    (30 s), exactly what the fix meant to prevent ("every sweeper reading the index slept past
    it"). A step that published proves the group's deadlines applied again (every step applies
    the passed ones first); a group deleted and created again under the name inherits the
    backoff the same way."""
    import redis
    from harness import server_ms
    from test_review73c import sweeper_beside_a_coordinator

    from rcoord import Errors

    client, coord, sweeper = sweeper_beside_a_coordinator(own_server, namespace)
    # The sweeper's expire_deadlines of the group was sent now and failed; before its reply
    # came back a step of the group ran and published its real earliest deadline (the member's
    # session, 10 s ahead).
    sent_at = sweeper.server_now()
    mid = coord.join_group("good", **JOIN).member_id
    res = coord.join_group("good", mid, **JOIN)
    assert res.error == Errors.NONE
    assert coord.sync_group("good", res.generation_id, mid, assignments={}).error == Errors.NONE
    due = coord._keys("good").partition.due
    ea = client.hget(coord._keys("good").group, "ea")
    assert ea is not None and int(ea) > server_ms(client)  # healthy: nothing due
    sweeper._failed(0, "good", redis.ResponseError("a transient failure"), client, sent_at)
    assert client.zscore(due, "good") == int(ea)  # 44ac6ba: the index keeps it

    sweeper.resync({0})  # the lease holder re-reads its partitions (as every second)
    assert sweeper.next_due() <= int(ea), (
        f"the sweeper wakes at {sweeper.next_due():.0f}, {sweeper.next_due() - int(ea):.0f} "
        f"ms past the group's published earliest deadline {int(ea)}")


@pytest.mark.spark
@pytest.mark.timeout(120)
def test_a_topic_created_again_shorter_while_a_task_reads_it_is_said_to_be_created_again(
        redis_server: Any, single_client: Any, namespace: str) -> None:
    """576cfee checks the create token after a fetch that answered records (Errors.NONE) only:
    a topic deleted and created again between two fetches of a task, with fewer records than
    the offset the task reads next (a new topic is empty at first), answers
    OFFSET_OUT_OF_RANGE past its log end, and the task reports the loss as "records lost
    since, e.g. by a failover to a replica that did not have them": the operator is sent to
    look at replicas for a topic that was re-created. The start's check (and the commit's
    message) name the cause: "deleted and created again"."""
    from rcoord.spark.options import ReadKind, parse_read_options
    from rcoord.topics import Producer, ProducerRecord, Topics

    source = pytest.importorskip("rcoord.spark.source")  # pyspark, but no JVM
    resolve = pytest.importorskip("rcoord.spark.resolve")
    topics = Topics(single_client, namespace)
    topics.create("ev", 1)
    Producer(single_client, namespace).send_batch(
        "ev", [ProducerRecord(f"old{i}".encode(), None, 0) for i in range(6)])
    opts = {"url": redis_server.url, "namespace": namespace, "subscribe": "ev",
            "fetchSize": "2", "failOnDataLoss": "true"}
    reader = source.BatchReader(parse_read_options(opts, ReadKind.BATCH, env={}))
    (task,) = reader.partitions()  # ev-0, offsets 0..5
    chunks = iter(reader.read(task))
    assert next(chunks).column("value").to_pylist() == [b"old0", b"old1"]
    topics.delete("ev")
    topics.create("ev", 1)  # empty: its log ends at 0, before the task's next offset (2)
    with pytest.raises(resolve.DataLossError) as lost:
        for _ in chunks:
            pass
    assert "created again" in str(lost.value), str(lost.value)
