"""Group mode under ``startingOffsets=latest``: the starts this process chose (``_chosen``)
after their commits landed, the clock that dates a start chosen without its token, and a topic
made again between the query's join and its token read. Each test failed on the code before
its fix (``StreamMember`` driven through fake generations: no Spark, no group thread)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import redis
from test_spark_member_reads import member  # noqa: F401  (fixture)
from test_spark_unknown_token import EV0, chosen_without_a_token, created_again, generation

from rcoord.errors import ConnectionLost
from rcoord.spark.plan import Position
from rcoord.spark.resolve import DataLossError, log_snapshot
from rcoord.topics import Producer, ProducerRecord, Topics


def read_on_from_9_to_20(member: Any, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                         redis_client: Any,
                         namespace: str) -> tuple[Topics, Any, list[Any], Position]:
    """ev-0 (20 records) placed at 9 with its topic's token by a first generation, then read
    to 20 and committed: (topics, the latest snapshot, the commits made, the plan at 20)."""
    topics = Topics(redis_client, namespace)
    Producer(redis_client, namespace).send_batch(
        "ev", [ProducerRecord(b"x", partition=0) for _ in range(20)])
    monkeypatch.setattr(member._group, "start", lambda: None)  # (no thread: gen is the fake)
    latest = partial(log_snapshot, topics)
    commits: list[Any] = []
    member._begin(generation({EV0: 9}, commits), True)
    first = member.plan(Position({}), latest, None)
    assert first.offsets[EV0] == 20
    assert member.plan(first, latest, None) == first  # (commits 20: nothing new)
    return topics, latest, commits, first


def test_a_chosen_start_read_on_is_lost_from_where_the_query_committed(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,  # noqa: F811
    namespace: str,
) -> None:
    # ev-0 is placed at its log end, 9, with its topic's token, and that commit lands; the
    # query reads 9 to 20 and commits 20. The topic is then made again with a log past 20,
    # and the next generation finds no committed offset (the group's commit is older than
    # the new topic). Before, it began ev-0 at the chosen start, 9, which was never moved:
    # "created again since offset 9", though the query had read and committed up to 20
    # (and, had the group's offset merely expired, it read 9 to 20 again).
    topics, latest, commits, first = read_on_from_9_to_20(member, monkeypatch, redis_client,
                                                          namespace)
    token = topics.create_token("ev")
    assert commits == [{EV0: (9, token)}, {EV0: (20, token)}]
    topics.delete("ev")
    created_again(topics, redis_client, namespace, 25)
    member._begin(generation({EV0: 25}, commits, number=2), False)
    with pytest.raises(DataLossError, match="since offset 20 was planned"):
        member.plan(first, latest, None)
    assert member._placed == {EV0: 20}


def test_a_chosen_start_read_on_is_taken_up_from_the_commit_when_it_expires(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,  # noqa: F811
    namespace: str,
) -> None:
    # As above, but the topic stays: the group's offset 20 is gone (expired, or deleted by
    # an operator), and the next generation finds none. Before, it began again at 9, and
    # committed it: the query read 9 to 20 a second time.
    topics, _, commits, _ = read_on_from_9_to_20(member, monkeypatch, redis_client, namespace)
    member._begin(generation({EV0: 20}, commits, number=2), False)
    assert member._placed == {EV0: 20}
    assert commits[-1] == {EV0: (20, topics.create_token("ev"))}


def test_a_start_is_not_dated_by_another_masters_clock(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,  # noqa: F811
    namespace: str, backend: str,
) -> None:
    # In a cluster a start chosen without its token is dated by its topic's master (3bde4a2),
    # whose TIME stamped the topic's created_ms; when that master did not answer, any node's
    # clock dated it. Another master's clock an hour behind dated a start chosen just after
    # the topic was created before the creation, and the unchanged topic was reported as
    # made again (a false DataLossError; one ahead would take a topic made again just after
    # the start for the same one, and read it from the old offset, unreported). Undated, the
    # start is chosen again by the next generation (from its log start: read again, never
    # lost), as when no clock answers. The other clock is driven by TIME sent to no node in
    # particular; the topic's master (TIME sent to it) does not answer.
    if backend != "cluster":
        pytest.skip("one node: one clock")
    time = redis_client.time

    def other_masters(**kw: Any) -> Any:
        if "target_nodes" in kw:
            raise redis.ConnectionError("the topic's master does not answer")
        secs, micros = time(**kw)
        return int(secs) - 3600, micros

    topics = Topics(redis_client, namespace)
    topics.delete("ev")
    topics.create("ev", 1)
    monkeypatch.setattr(redis_client, "time", other_masters)
    chosen_without_a_token(member, monkeypatch)
    commits: list[Any] = []
    try:
        placed = member._place(generation({EV0: 12}, commits), False)
    except DataLossError as exc:
        pytest.fail(f"dated by another master's clock, the unchanged topic was made again: {exc}")
    assert placed == {EV0: 0}
    assert commits == [{EV0: (0, topics.create_token("ev"))}]


def joining_makes_ev_again(topics: Topics, redis_client: Any, namespace: str,
                           commits: list[Any]) -> Any:
    """A fake ``ConsumerGroup.next`` for a query starting under latest: "ev" holds 9 records,
    the join reads that log end (9), then the topic is deleted and made again with 12 records
    before the member reads its token."""
    Producer(redis_client, namespace).send_batch(
        "ev", [ProducerRecord(b"x", partition=0) for _ in range(9)])

    def join(timeout: float | None = None) -> Any:
        gen = generation({EV0: 9}, commits)  # (the log end the join read)
        gen.start = lambda routine: None
        topics.delete("ev")
        created_again(topics, redis_client, namespace, 12)
        return gen

    return join


def test_a_topic_made_again_between_the_join_and_the_token_read_is_read_from_its_log_start(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,  # noqa: F811
    namespace: str,
) -> None:
    # The query starts under latest: its join reads ev-0's log end, 9; the topic is then
    # deleted and made again with 12 records, before the member reads its token. Before, the
    # start was the old topic's 9 under the new topic's token, committed so: the new topic's
    # first 9 records, all appended after the query began, were skipped unreported. Now the
    # token read before the join differs from the one after it: the topic was made again
    # since the query began, and is read from its log start, as a topic that appears later.
    topics = Topics(redis_client, namespace)
    commits: list[Any] = []
    join = joining_makes_ev_again(topics, redis_client, namespace, commits)
    monkeypatch.setattr(member._group, "next", join)
    start = member.initial(5.0)
    assert start.offsets[EV0] == 0
    assert commits == [{EV0: (0, topics.create_token("ev"))}]


def test_a_topic_made_again_since_the_join_whose_log_start_is_unknown_is_data_loss(
    member: Any, monkeypatch: pytest.MonkeyPatch, redis_client: Any,  # noqa: F811
    namespace: str,
) -> None:
    # As above, but the new topic's log start cannot be read: the start stays the join's 9,
    # as the old topic's, uncommitted, and the first plan reports the topic made again (it
    # was taken for the new topic's offset, its first 9 records skipped unreported).
    topics = Topics(redis_client, namespace)
    commits: list[Any] = []
    join = joining_makes_ev_again(topics, redis_client, namespace, commits)
    log_starts = member._log_starts

    def unknown(tps: Any) -> Any:
        return {tp: ConnectionLost("Redis away") if tp == EV0 else got
                for tp, got in log_starts(tps).items()}

    monkeypatch.setattr(member._group, "next", join)
    monkeypatch.setattr(member._group, "start", lambda: None)  # (no thread: gen is the fake)
    with monkeypatch.context() as patch:
        patch.setattr(member, "_log_starts", unknown)
        member.initial(5.0)
    assert commits == []
    with pytest.raises(DataLossError, match="created again since offset 9 was planned"):
        member.plan(Position({}), partial(log_snapshot, topics), None)
