"""Topic administration under redis-py's default Retry, when the reply to a script call is lost.

redis-py 8 resends a command or a whole pipeline (10 times by default) after a ConnectionError,
so "the script ran, its reply was lost, and the same call ran again" happens without any user
setting. ``LossyConnection`` makes it happen on cue against the real server: it lets the server
run the marked request, reads the reply, and then reports a dropped connection instead, exactly
what a connection reset after the server's answer looks like to the client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.connection

from rcoord import Errors
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Producer, TopicError, Topics, fetch, partition_key
from rcoord.topics._base import CREATE_META, GROW_META, MAKE, _Lua, creation_token_key


class Loss:
    """Which reply to lose: that of the next request carrying ``script``'s SHA (for a pipeline,
    after the replies of every call of that script in it). ``before_loss`` runs when the server
    has answered and before the client learns of the loss (what another client does meanwhile).
    """

    def __init__(self) -> None:
        self.marker: bytes | None = None
        self.before_loss: Callable[[], None] | None = None
        self.lost = 0

    def arm(self, script: _Lua, before_loss: Callable[[], None] | None = None) -> None:
        self.marker = script.sha.encode()
        self.before_loss = before_loss


def lossy_client(server: EmbeddedServer, loss: Loss) -> redis.Redis:
    """A client with redis-py's default Retry whose connections lose the replies ``loss``
    names."""

    class LossyConnection(redis.connection.Connection):
        replies_to_lose = 0

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            data = bytes(command) if isinstance(command, (bytes, bytearray)) else b"".join(
                bytes(part) for part in command)
            if loss.marker is not None and loss.marker in data:
                self.replies_to_lose = data.count(loss.marker)
                loss.marker = None
            super().send_packed_command(command, check_health)

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            reply = super().read_response(*args, **kwargs)
            if self.replies_to_lose:
                self.replies_to_lose -= 1
                if not self.replies_to_lose:
                    loss.lost += 1
                    if loss.before_loss is not None:
                        loss.before_loss()
                    self.disconnect()
                    raise redis.exceptions.ConnectionError("reply lost on purpose (test)")
            return reply

    client = server.client()
    client.connection_pool.connection_class = LossyConnection
    return client


@pytest.fixture
def loss() -> Loss:
    return Loss()


@pytest.fixture
def lossy(redis_server: EmbeddedServer, loss: Loss,
          single_client: redis.Redis) -> Iterator[redis.Redis]:
    # Loaded first, so that the first reply to the marked call is the script's answer, not
    # NOSCRIPT (a call that did not run).
    for script in (CREATE_META, GROW_META, MAKE):
        single_client.script_load(script.source)
    client = lossy_client(redis_server, loss)
    try:
        yield client
    finally:
        client.close()


def test_create_whose_claim_reply_was_lost_still_makes_every_partition(
    lossy: redis.Redis, loss: Loss, single_client: redis.Redis, namespace: str
) -> None:
    loss.arm(CREATE_META)
    Topics(lossy, namespace).create("t", 3)
    assert loss.lost == 1  # the claim ran, and ran again after the lost reply
    desc = Topics(single_client, namespace).describe("t")
    assert [(p.partition, p.error) for p in desc.partitions] == [
        (0, Errors.NONE), (1, Errors.NONE), (2, Errors.NONE)]
    assert Producer(single_client, namespace).send("t", b"x", partition=2).offset == 0
    # Another create of the same name is still a different call, and still refused.
    with pytest.raises(TopicError) as err:
        Topics(lossy, namespace).create("t", 3)
    assert err.value.error == Errors.TOPIC_ALREADY_EXISTS


def test_create_whose_make_reply_was_lost_keeps_acknowledged_records(
    lossy: redis.Redis, loss: Loss, single_client: redis.Redis, namespace: str
) -> None:
    producer = Producer(single_client, namespace)
    acked = []

    def producer_appends_meanwhile() -> None:
        acked.append(producer.send("t", b"a", partition=0))
        acked.append(producer.send("t", b"b", partition=1))

    loss.arm(MAKE, producer_appends_meanwhile)
    Topics(lossy, namespace).create("t", 2)
    assert loss.lost == 1
    assert [(m.partition, m.offset) for m in acked] == [(0, 0), (1, 0)]
    for p, value in ((0, b"a"), (1, b"b")):
        res = fetch(single_client, namespace, "t", p, 0)
        assert [(r.offset, r.value) for r in res.records] == [(0, value)]
    assert producer.send("t", b"c", partition=0).offset == 1  # offset 0 is not handed out twice


def test_add_partitions_whose_reply_was_lost_succeeds(
    lossy: redis.Redis, loss: Loss, single_client: redis.Redis, namespace: str
) -> None:
    Topics(single_client, namespace).create("t", 1)
    loss.arm(GROW_META)
    Topics(lossy, namespace).add_partitions("t", 3)
    assert loss.lost == 1
    desc = Topics(single_client, namespace).describe("t")
    assert [(p.partition, p.error) for p in desc.partitions] == [
        (0, Errors.NONE), (1, Errors.NONE), (2, Errors.NONE)]
    # Asking for the count the topic has is still refused, as in Kafka.
    with pytest.raises(TopicError) as err:
        Topics(lossy, namespace).add_partitions("t", 3)
    assert err.value.error == Errors.INVALID_PARTITIONS


def test_create_still_clears_what_an_older_topic_left(
    single_client: redis.Redis, namespace: str
) -> None:
    """The token only spares what this very call made: a stream left by an older topic of the
    same name (a crashed delete) carries another token, or none, and is replaced."""
    topics = Topics(single_client, namespace)
    topics.create("t", 1)
    Producer(single_client, namespace).send("t", b"old", partition=0)
    single_client.delete(f"{namespace}:topicmeta:{{t}}")  # the stream is left over
    assert single_client.exists(creation_token_key(namespace, "t", 0))
    topics.create("t", 1)
    assert fetch(single_client, namespace, "t", 0, 0).records == []
    assert Producer(single_client, namespace).send("t", b"new", partition=0).offset == 0
    topics.delete("t")
    assert not single_client.exists(partition_key(namespace, "t", 0))
    assert not single_client.exists(creation_token_key(namespace, "t", 0))
