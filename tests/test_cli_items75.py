"""Four CLI items: ``groups describe --verbose``'s ASSIGNMENT column, the date-times
``reset-offsets --to-datetime`` takes (exactly Kafka's ``Utils.getDateTime``'s),
``topics alter-configs --delete-config`` of several unknown names, and a reset by time of a
topic deleted and made again between the read of its log offsets and the search by time."""

from __future__ import annotations

import json
from typing import Any

import pytest
import test_cli_groups
from test_cli_groups import committed, ok, produce, rows, stable_group

import rcoord.topics
from rcoord import TopicPartition
from rcoord.ops.reset import parse_datetime
from rcoord.topics import Topics

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


# -- groups describe --verbose ----------------------------------------------------------------


def test_describe_verbose_adds_each_members_partitions(cli, make_coordinator, redis_client,
                                                       namespace, pool):
    """Kafka's ``--describe --members --verbose`` adds ASSIGNMENT, ``topic(p,p)``, to the
    members' table; ``--verbose`` was refused as an unknown option."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("orders", 12)
    _, ids = stable_group(coord, pool, "busy", "orders",
                          {"alpha": [10, 2, 0], "beta": [1], "gamma": []})
    res = ok(cli("groups", "describe", "busy", "--members", "--verbose"))
    assert res.stdout.splitlines()[0].split() == [
        "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
    assert sorted(rows(res.stdout, "CONSUMER-ID")) == sorted([
        [ids["alpha"], "-", "/10.0.0.5", "alpha", "3", "orders(0,2,10)"],
        [ids["beta"], "-", "/10.0.0.4", "beta", "1", "orders(1)"],
        [ids["gamma"], "-", "/10.0.0.5", "gamma", "0", "-"],
    ])
    # Without a view the members' table has it too; --state and --offsets take --verbose and
    # are unchanged by it, as Kafka's; without --verbose there is no such column.
    assert "ASSIGNMENT" in ok(cli("groups", "describe", "busy", "--verbose")).stdout
    for view in ("--state", "--offsets"):
        assert (ok(cli("groups", "describe", "busy", view, "--verbose")).stdout
                == ok(cli("groups", "describe", "busy", view)).stdout)
    assert "ASSIGNMENT" not in ok(cli("groups", "describe", "busy", "--members")).stdout
    # JSON has every member's partitions anyway.
    doc = json.loads(ok(cli("groups", "describe", "busy", "--verbose", "--output",
                            "json")).stdout)
    assert sorted(next(m["partitions"] for m in doc["members"] if m["client_id"] == "alpha")) \
        == [["orders", 0], ["orders", 2], ["orders", 10]]


def test_an_assignment_of_several_topics_is_one_group_per_topic():
    from rcoord.ops.groups import _assignment

    tps = [TopicPartition("b", 1), TopicPartition("a", 10), TopicPartition("a", 9)]
    assert _assignment(tps) == "a(9,10), b(1)"
    assert _assignment([]) is None


# -- reset-offsets --to-datetime --------------------------------------------------------------

T0 = 1_714_521_600_000  # 2024-05-01T00:00:00.000Z


@pytest.mark.parametrize(("text", "ms"), [
    ("2024-05-01T00:00:00.000", T0),  # no zone: UTC
    ("2024-05-01T00:00:00.000Z", T0),
    ("2024-05-01T02:00:00.000+02", T0),
    ("2024-05-01T02:00:00.000+0200", T0),  # (+hhmm only as +hh00: Kafka drops the mm)
    ("2024-05-01T02:30:00.000+02:30", T0),
    ("2024-04-30T23:00:00.250-01:00", T0 + 250),
])
def test_to_datetime_takes_kafkas_forms(text, ms):
    assert parse_datetime(text) == ms


@pytest.mark.parametrize("text", [
    "2024-05-01",  # a date alone: was midnight UTC
    "2024-05-01T10:00:00Z",  # no milliseconds (Kafka's pattern has .SSS)
    "2024-05-01T10:00:00",
    "2024-05-01T10:00",
    "2024-05-01 10:00:00.000",  # a blank for the T
    "20240501T100000.000",
    "2024-05-01T10:00:00.000z",
    "2024-05-01T10:00:00.000+24:00",
    "2024-05-01T10:00:00.000Z!",
])
def test_to_datetime_refuses_other_forms_naming_the_flag_and_the_form(cli, text):
    res = cli("groups", "reset-offsets", "g", "--topic", "t", "--to-datetime", text)
    assert res.returncode == 2 and res.stdout == ""
    assert f"--to-datetime {text!r} is not an ISO-8601 date-time" in res.stderr
    assert "YYYY-MM-DDTHH:mm:SS.sss" in res.stderr and "Traceback" not in res.stderr


# -- topics alter-configs --delete-config -----------------------------------------------------


def test_a_delete_of_several_unknown_configs_names_every_one(cli, redis_client, namespace):
    """kafka-configs.sh's "Invalid config(s): a,b" names them all; only the first was named, so
    the second typo was found only once the first was mended. Nothing is changed."""
    topics = Topics(redis_client, namespace)
    topics.create("t", 1, retention_ms=60_000)
    res = cli("topics", "alter-configs", "t", "--add-config", "retention.ms=1000",
              "--delete-config", "retention.m,cleanup.policy", "--delete-config", "segmnt.ms")
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert "Unknown topic config names: retention.m, segmnt.ms (rcoord topics have: " \
        in res.stderr
    assert topics.settings("t")["retention_ms"] == 60_000


# -- a reset by time of a topic made again ----------------------------------------------------


@pytest.mark.parametrize("again", [True, False], ids=["made-again", "deleted"])
def test_a_reset_by_time_refuses_a_topic_deleted_after_its_offsets_were_read(
        cli, make_coordinator, redis_client, namespace, monkeypatch, again):
    """The topic is deleted (and made again, with a record of its own) after the command read
    its log offsets and before it searches by time. The search answered the new topic's offset
    0, which the plan clamped to the old topic's log start, 7, and committed: past the new
    topic's log end (1), an offset of neither. Now nothing is committed and the error says
    why; deleted and not made again, the search's error said only UNKNOWN_TOPIC_OR_PARTITION."""
    coord = make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("t", 1)
    secs, _ = redis_client.time()
    now = int(secs) * 1000
    produce(redis_client, namespace, "t", {0: 10}, stamps=[now - 3_600_000] * 10)
    topics.delete_records("t", {0: 7})
    coord.commit_offsets("g", {TopicPartition("t", 0): 8})
    real = rcoord.topics.offsets_for_times

    def made_again(*args: Any, **kwargs: Any) -> Any:
        topics.delete("t")
        if again:
            topics.create("t", 1)
            produce(redis_client, namespace, "t", {0: 1}, stamps=[now] * 1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rcoord.topics, "offsets_for_times", made_again)
    res = cli("groups", "reset-offsets", "g", "--topic", "t", "--by-duration", "PT30M",
              "--execute")
    assert res.returncode == 1 and res.stdout == "", res.stdout + res.stderr
    assert ("topic 't' was deleted" + (" and created again" if again else "")
            + " while the reset read it; nothing was changed") in res.stderr
    assert committed(coord, "g") == {("t", 0): 8}
