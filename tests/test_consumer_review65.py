"""The iterator and a partition given up and assigned again, and ``close()``'s bound over a
pending start.

Kafka's ``assign()`` forgets a partition's position when it gives the partition up: assigned
again, the partition starts at its committed offset, and ``position()`` reads it now.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import WAIT_S, InThread, wait_until
from test_consumer import env, poll_until  # noqa: F401 - env: the fixture
from test_consumer_review64_iterate import TP0, U0, _t0_committed_at_3

from rcoord.client import Consumer, ConsumerGroupConfig
from rcoord.client import consumer as consumer_module
from rcoord.client import group as group_module
from rcoord.client.coordinator import RedisCoordinator
from rcoord.client.errors import IllegalStateError
from rcoord.testing.embedded import EmbeddedServer


def test_loop_left_after_position_of_a_reassigned_partition_keeps_its_start(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The loop body commits 5, gives t-0 up and assigns it again, asks its position() (5:
    it is started now) and breaks: leaving the loop sought t-0 back to the record the loop
    was on (3), the previous assignment's (its seek count, forgotten with it, matched the
    batch's again), so records 3 and 4 came again."""
    consumer = _t0_committed_at_3(env)
    for _ in consumer:
        consumer.commit({TP0: 5})
        consumer.assign([U0])
        consumer.assign([TP0])
        assert consumer.position(TP0) == 5
        break
    assert consumer.position(TP0) == 5
    got = poll_until(consumer, lambda g: bool(g) and g[-1].offset == 9)
    assert [r.offset for r in got] == [5, 6, 7, 8, 9]


@pytest.mark.parametrize("subscribed", [False, True])
def test_close_past_a_held_start_leaves_no_connection_of_its_own_client_open(
        redis_server: EmbeddedServer, namespace: str, monkeypatch: pytest.MonkeyPatch,
        subscribed: bool) -> None:
    """committed() on one thread starts the coordinator on the client made from
    ``redis_url`` (held there), and close(0.5) on another returns before it ends: close()
    closed that client, and the start, then the query, went on on it and connected it again;
    nothing closed it afterwards (the connection stayed open as long as the consumer). Now the
    client is closed once the start returned, and the query, the consumer closed by then,
    raises as a call on a closed consumer does."""
    entered, released = threading.Event(), threading.Event()

    class Held(RedisCoordinator):
        def start(self) -> Any:
            entered.set()
            assert released.wait(WAIT_S)
            return super().start()

    # (the consumer's own coordinator after assign(), the group's when subscribed)
    monkeypatch.setattr(group_module if subscribed else consumer_module,
                        "RedisCoordinator", Held)
    admin = redis_server.client()

    def connections() -> int:
        return sum(1 for c in admin.client_list() if c.get("name") == namespace)

    consumer = Consumer(ConsumerGroupConfig(
        group_id=namespace, topics=["t"] if subscribed else [], namespace=namespace,
        redis_url=f"{redis_server.url}?client_name={namespace}"))
    try:
        query = InThread(lambda: consumer.committed([TP0], timeout=WAIT_S))
        wait_until(entered.is_set)
        consumer.close(timeout=0.5)
        released.set()
        query.thread.join(WAIT_S)
        assert not query.thread.is_alive()
        wait_until(lambda: connections() == 0,
                   why=lambda: f"{connections()} connection(s) of the closed consumer's client")
        # (its query after the start, on a consumer closed meanwhile, is not made)
        assert isinstance(query.outcome[0], IllegalStateError), query.outcome
    finally:
        released.set()
        admin.close()


def test_close_in_the_loop_body_after_reassigning_a_partition_keeps_its_new_start(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The loop body, on record 3, commits (4), gives t-0 up and assigns it again (it starts
    at 4) and closes: close() took record 3 of the old assignment as not processed yet (its
    ``_unacked`` entry was kept when the partition was given up), rewound the new one to it
    and committed 3 over 4."""
    consumer = _t0_committed_at_3(env, enable_auto_commit=True)
    for _ in consumer:
        consumer.commit()
        consumer.assign([U0])
        consumer.assign([TP0])
        assert consumer.position(TP0) == 4
        consumer.close()
    reader: Consumer = env.consumer(topics=[], enable_auto_commit=False)
    assert reader.committed([TP0]) == {TP0: 4}
