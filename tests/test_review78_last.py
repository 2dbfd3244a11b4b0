"""Review of the last session's commits (b222add..5087d26): each test FAILS on the code it was
written against, showing what a user sees go wrong."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import FAST
from test_cli_errors import one_error_line, rcoord

from rcoord import Errors, GroupCoordinator, TopicPartition
from rcoord.config import CoordinatorConfig
from rcoord.topics import Topics

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
    from rcoord.spark.plan import Position
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
