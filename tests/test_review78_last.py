"""Review of the last session's commits (b222add..5087d26): each test FAILS on the code it was
written against, showing what a user sees go wrong."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pytest
from conftest import FAST
from test_cli_errors import one_error_line, rcoord
from test_spark_member_reads import member, warned  # noqa: F401  (fixture)
from test_spark_unknown_token import EV0, generation

from rcoord import Errors, GroupCoordinator, TopicPartition
from rcoord.config import CoordinatorConfig
from rcoord.errors import ConnectionLost
from rcoord.spark.plan import Position
from rcoord.spark.resolve import DataLossError, log_snapshot
from rcoord.topics import Producer, ProducerRecord, Topics

TP = TopicPartition("orders", 0)


def _coordinator(client: Any, namespace: str) -> GroupCoordinator:
    return GroupCoordinator(client, CoordinatorConfig(namespace=namespace, **FAST)).start()


# 3b1de2e moved the Spark replay record to <ns>:{}:replays:<group> so that no other
# namespace's key can be it. But Topics.list() finds a namespace's topics by SCAN MATCH
# "<ns>:topicmeta:{*}" and takes every key that ends in "}" for a topic's metadata hash. A
# namespace may be called "<ns>:topicmeta" (names.NAMESPACE_RULE), and its replay record of a
# group whose id ends in "}" (any character is a legal group id) is now
# "<ns>:topicmeta:{}:replays:q}": listed in <ns> as a topic named "}:replays:q" (before
# 3b1de2e the record had no brace and did not match). Any group's keys of that namespace do the
# same ("<ns>:topicmeta:{<tag>}:o:q}", older than that commit). `rcoord topics list` and
# `rcoord topics describe` in <ns> then fail whole, exit 2: "error: INVALID_TOPIC_EXCEPTION:
# illegal topic name '}:replays:q'" (list() also feeds pattern subscriptions and retention).


@pytest.mark.parametrize("source", ["spark replay record", "group offsets"])
def test_another_namespaces_keys_are_not_listed_as_topics(
    redis_client: Any, namespace: str, source: str
) -> None:
    from rcoord.spark.replays import record_replay

    other = f"{namespace}:topicmeta"  # a valid namespace
    victim = _coordinator(redis_client, other)
    _coordinator(redis_client, namespace)
    if source == "spark replay record":
        record_replay(redis_client, other, "q}", Position({}, generation=3, member="m"), 4)
    else:
        assert victim.commit_offsets("q}", {TP: 1})[TP] == Errors.NONE
    topics = Topics(redis_client, namespace)
    topics.create("orders", 1)

    assert topics.list() == ["orders"]


# 4e79ae3 made cli._NUMBER take "-1e3" as a value, so the Parser no longer refuses it as an
# unknown option "-1"; but argparse itself (Python 3.11's _negative_number_matcher:
# '^-\d+$|^-\d*\.\d+$') still takes "-1e3" for an option, so the flag before it gets no value:
# "argument --time-limit: expected one argument", though one was given, where "-1000" (the
# same number) is named with the flag's range. The reviewer's test accepted any line naming
# the flag.


@pytest.mark.parametrize("flag", ["--time-limit", "--produce-seconds"])
def test_a_negative_exponent_is_the_same_number_as_its_digits(flag: str) -> None:
    env = {"RCOORD_REDIS_URL": "redis://127.0.0.1:1"}
    digits = one_error_line(rcoord("demo", flag, "-1000", env=env), "demo")
    exponent = one_error_line(rcoord("demo", flag, "-1e3", env=env), "demo")
    assert exponent == digits


# bea10a3 dates a start chosen without its topic's token (_chosen_ms) and d46e160 settles the
# date in plan() whenever a partition has no token to compare (planned None): the topic's
# creation time at least the date is "the topic was deleted and created again since offset
# <start> was chosen". The date is dropped only by _settle_tokens. A start never settled (its
# generation ended before a plan, and the partition went to another member) keeps its date for
# the life of the process. When the partition comes back with the group's committed offset in
# a topic made again meanwhile, committed without a token (a plain worker's commit, or the
# metadata fetch failed), the old date judges that offset: a loss nobody had is reported
# (failOnDataLoss: the query fails; else it restarts at the log start and reads the records
# the group had committed again).


def test_a_stale_date_does_not_judge_the_groups_later_commit(
    member: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    redis_client: Any,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topics = Topics(redis_client, namespace)
    producer = Producer(redis_client, namespace)
    producer.send_batch("ev", [ProducerRecord(b"x", partition=0) for _ in range(9)])

    def away(self: Any, topic: str) -> str:
        raise ConnectionLost("Redis away")

    monkeypatch.setattr(member._group, "start", lambda: None)  # (no thread: gen is the fake)
    with monkeypatch.context() as patch:  # generation 1 places ev-0 at 9, dated; it ends
        patch.setattr(Topics, "create_token", away)
        member._begin(generation({EV0: 9}, [], fails=True), True)
    assert member._chosen_ms.get(EV0) is not None
    # Meanwhile another member holds ev-0; the topic is made again, and the group reads the
    # new topic's 12 records and commits 12 (a plain commit: no token in its metadata).
    topics.delete("ev")
    topics.create("ev", 1)
    producer.send_batch("ev", [ProducerRecord(b"x", partition=0) for _ in range(12)])
    assert member._group.coordinator.commit_offsets("g", {EV0: 12})[EV0] == Errors.NONE
    # Generation 5 gives ev-0 back to this process, at the group's committed offset.
    member._begin(generation({EV0: 12}, [], number=5, committed={EV0: 12}), False)
    with caplog.at_level(logging.WARNING, "rcoord.spark"):
        try:
            end = member.plan(Position({}), partial(log_snapshot, topics), None)
        except DataLossError as exc:
            pytest.fail(
                f"the group's offset 12 in the new topic was judged by generation 1's date: {exc}"
            )
    assert end.starts.get(EV0, end.offsets[EV0]) == 12, (end, warned(caplog))
