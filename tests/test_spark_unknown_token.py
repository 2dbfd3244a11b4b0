"""Group mode under ``startingOffsets=latest``: a start chosen while its topic's create token
could not be read (``StreamMember._settle_tokens``), and a loss reported once when a topic is
made again (``StreamMember._check_unread``)."""

from __future__ import annotations

import logging
import threading
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from test_spark_member_reads import member, starts_of, warned  # noqa: F401  (fixture)

from rcoord.errors import ConnectionLost
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.spark.member import _parse_metadata
from rcoord.spark.plan import Position
from rcoord.spark.resolve import DataLossError, log_snapshot
from rcoord.topics import Producer, ProducerRecord, Topics

EV0 = TP("ev", 0)


def generation(offsets: dict[TP, int], commits: list[Any], *, fails: bool = False,
               number: int = 1, committed: dict[TP, int] | None = None) -> Any:
    """Generation ``number`` of member "m" with ``committed`` (by default nothing); its
    commits land in ``commits``, or fail as those of a generation that ended (``fails``)."""
    def commit(offsets: dict[TP, Any]) -> None:
        if fails:
            raise ConnectionLost("the generation ended")
        commits.append({tp: (o.offset, _parse_metadata(o.metadata)[0])
                        for tp, o in offsets.items()})

    return SimpleNamespace(group_id="g", member_id="m", generation_id=number,
                           committed=committed or {}, offsets=offsets, commit_offsets=commit,
                           done=threading.Event())


def away(self: Any, topic: str) -> str:
    """``Topics.create_token`` while Redis is away."""
    raise ConnectionLost("Redis away")


def chosen_without_a_token(stream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The query's first generation places ev-0 at its log end, 9, while the token read fails,
    and its commit of that start fails too (the generation ended)."""
    with monkeypatch.context() as patch:
        patch.setattr(Topics, "create_token", away)
        assert stream._place(generation({EV0: 9}, [], fails=True), True) == {EV0: 9}


def began_at_its_start(stream: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,
                       namespace: str) -> Topics:
    """The query began every partition of "ev" at its log start (``_seen``), reads without
    failOnDataLoss, and its group has no thread (the generations are fakes); "ev"'s admin."""
    stream._fail = False
    stream._seen.update(starts_of())
    monkeypatch.setattr(stream._group, "start", lambda: None)
    return Topics(redis_client, namespace)


def created_again(topics: Topics, redis_client: Any, namespace: str, records: int,
                  trim: int = 0) -> None:
    """Create the deleted "ev" again with one partition of ``records`` records, its log
    trimmed to ``trim`` by retention."""
    topics.create("ev", 1)
    Producer(redis_client, namespace).send_batch(
        "ev", [ProducerRecord(b"x", partition=0) for _ in range(records)])
    if trim:
        topics.delete_records("ev", {0: trim})


def test_a_start_chosen_without_its_token_is_committed_once_the_token_is_read(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,  # noqa: F811
    namespace: str,
) -> None:
    # The next generation of this process places ev-0 where it was chosen. Before, with no
    # token to compare, that start was never committed: when this generation too ended
    # before its first batch committed, the partition's next owner (another query starting)
    # placed it at a newer log end, and the records between were neither read nor reported.
    chosen_without_a_token(member, monkeypatch)
    commits: list[Any] = []
    assert member._place(generation({EV0: 12}, commits), False) == {EV0: 9}
    token = Topics(redis_client, namespace).create_token("ev")
    assert commits == [{EV0: (9, token)}]
    assert member._base_tokens[EV0] == token


def test_a_start_chosen_without_its_token_in_a_topic_made_again_since_is_data_loss(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,  # noqa: F811
    namespace: str,
) -> None:
    # The topic is deleted and made again, and its new log passes the old start: nothing in
    # the offsets shows the re-creation. Before, the next generation started ev-0 at 9 in the
    # new topic, unreported: the old topic's records from 9 on and the new one's below 9 were
    # never read.
    chosen_without_a_token(member, monkeypatch)
    topics = Topics(redis_client, namespace)
    topics.delete("ev")
    created_again(topics, redis_client, namespace, 12)
    commits: list[Any] = []
    with pytest.raises(DataLossError, match="created again since offset 9 was chosen"):
        member._place(generation({EV0: 12}, commits), False)
    assert commits == []
    # Without failOnDataLoss the new topic is read from its log start, committed as its own.
    member._fail = False
    member._chosen[EV0], member._chosen_ms[EV0] = (9, None), 0  # (chosen before: dated 0)
    assert member._place(generation({EV0: 12}, commits), False) == {EV0: 0}
    assert commits == [{EV0: (0, topics.create_token("ev"))}]


def test_a_topic_made_again_is_one_data_loss_not_also_retention(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any, namespace: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    # ev-0 began at 0 for this query, at a start chosen in the old topic and not committed.
    # The topic is made again, and retention trims the new one's log to 3 before the next
    # generation plans it. Before, that one loss was reported twice: as the old topic's
    # offsets 0 to 2 "removed by retention" (the new topic's log start checked against the old
    # topic's start, _check_unread), and as the topic made again.
    topics = began_at_its_start(member, monkeypatch, redis_client, namespace)
    member._chosen[EV0] = (0, topics.create_token("ev"))
    topics.delete("ev")
    created_again(topics, redis_client, namespace, 5, trim=3)
    gen = generation({EV0: 5}, [], number=2)
    with caplog.at_level(logging.WARNING, "rcoord.spark"):
        member._begin(gen, False)
        end = member.plan(Position({}), lambda parts: log_snapshot(topics, parts), None)
    losses = [m for m in warned(caplog) if m.startswith("topic 'ev' partition 0")]
    assert losses == [("topic 'ev' partition 0: the topic was deleted and created again since "
                       "offset 0 was planned")], losses
    assert end.offsets == {EV0: 5} and end.starts == {EV0: 3}
    # The query began the new topic at 3: a later generation checks retention against that.
    assert member._seen[EV0] == 3


def test_a_topic_deleted_and_made_again_is_one_data_loss_in_the_next_generation(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any, namespace: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    # ev-0 began at 0 for this query. Its topic is deleted (reported: gone), made again with
    # its log trimmed to 3, and read from there; the generation ends before a commit lands.
    # Before, the next generation placed ev-0 at the new log start and checked it against the
    # old topic's start: "offsets 0 to 2 removed by retention", a second report of the loss.
    topics = began_at_its_start(member, monkeypatch, redis_client, namespace)
    latest = partial(log_snapshot, topics)
    with caplog.at_level(logging.WARNING, "rcoord.spark"):
        member._begin(generation({EV0: 0}, [], number=1, committed={EV0: 0}), False)
        topics.delete("ev")
        first = member.plan(Position({}), latest, None)
        created_again(topics, redis_client, namespace, 5, trim=3)
        assert member.plan(first, latest, None).starts == {EV0: 3}
        member._begin(generation({EV0: 5}, [], number=2), False)
    losses = [m for m in warned(caplog) if m.startswith("topic 'ev' partition 0")]
    assert losses == ["topic 'ev' partition 0 is gone"], losses  # (warned: up to " (")
    assert member._placed == {EV0: 3}


def test_a_dated_start_read_on_is_lost_from_where_the_query_committed(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,  # noqa: F811
    namespace: str,
) -> None:
    # ev-0 is placed at 9 while its token cannot be read (dated), and that commit lands; the
    # plans cannot read the token either, so the query reads 9 to 20 and commits 20 without
    # one. The topic is then made again with a log past 20. Before, the loss reported named
    # offset 9 (the date's start was never moved): "the old topic's records from 9 on were
    # never read", though the query had read and committed them up to 20.
    topics = Topics(redis_client, namespace)
    Producer(redis_client, namespace).send_batch(
        "ev", [ProducerRecord(b"x", partition=0) for _ in range(20)])
    monkeypatch.setattr(member._group, "start", lambda: None)  # (no thread: gen is the fake)
    commits: list[Any] = []

    def tokenless(parts: Any) -> Any:
        return log_snapshot(topics, parts)[0], {}

    with monkeypatch.context() as patch:
        patch.setattr(Topics, "create_token", away)
        member._begin(generation({EV0: 9}, commits), True)
    first = member.plan(Position({}), tokenless, None)
    assert first.offsets[EV0] == 20 and "ev" not in first.tokens
    assert member.plan(first, tokenless, None) == first  # (commits 20: nothing new)
    assert commits == [{EV0: (9, None)}, {EV0: (20, None)}]
    topics.delete("ev")
    created_again(topics, redis_client, namespace, 25)
    with pytest.raises(DataLossError, match="created again since offset 20 was chosen"):
        member.plan(first, partial(log_snapshot, topics), None)


def test_a_dated_start_is_timed_by_its_topics_master(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,  # noqa: F811
    namespace: str, backend: str,
) -> None:
    # In a cluster the topic's created_ms is its master's TIME; the start's date was any
    # node's. Another master's clock an hour behind dated a start chosen just after the topic
    # was created before the creation, and the unchanged topic was reported as made again
    # (a false DataLossError). The other clock is driven by TIME sent to no node in particular.
    if backend != "cluster":
        pytest.skip("one node: one clock")
    time = redis_client.time

    def other_masters(**kw: Any) -> Any:
        secs, micros = time(**kw)
        return (secs if "target_nodes" in kw else int(secs) - 3600), micros

    topics = Topics(redis_client, namespace)
    topics.delete("ev")
    topics.create("ev", 1)
    monkeypatch.setattr(redis_client, "time", other_masters)
    chosen_without_a_token(member, monkeypatch)
    commits: list[Any] = []
    assert member._place(generation({EV0: 12}, commits), False) == {EV0: 9}
    assert commits == [{EV0: (9, topics.create_token("ev"))}]
