"""Review 71 of the operator's CLI against Kafka's tools: reproductions of where ``rcoord
groups`` and ``rcoord topics consume`` answer otherwise than kafka-consumer-groups.sh and
kafka-console-consumer.sh for the same request, with no doc calling the difference deliberate.
Each test fails on the code it was written against."""

from __future__ import annotations

import pytest
import test_cli_groups
from test_cli_groups import ok, produce, rows, stable_group

from rcoord import TopicPartition
from rcoord.topics import Topics

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


@pytest.mark.parametrize("backend", ["single"])
def test_list_with_a_bare_state_lists_every_group_with_its_state(cli, make_coordinator,
                                                                 redis_client, namespace, pool):
    """``kafka-consumer-groups --list --state`` (no value) "displays the state of all groups"
    (ConsumerGroupCommandOptions: --state takes an optional argument); here it was a usage
    error, exit 2, "argument --state: expected one argument"."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    stable_group(coord, pool, "busy", "t", {"c1": [0]})
    coord.commit_offsets("idle", {TopicPartition("t", 0): 0})
    res = ok(cli("groups", "list", "--state"))
    assert [r[:2] for r in rows(res.stdout, "GROUP STATE")] == [["busy", "Stable"],
                                                              ["idle", "Empty"]]


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize(("view", "shown", "not_shown"), [
    ("--state", "STATE", "CURRENT-OFFSET"),
    ("--members", "#PARTITIONS", "CURRENT-OFFSET"),
    ("--offsets", "CURRENT-OFFSET", "#PARTITIONS"),
])
def test_describe_takes_kafkas_views(cli, make_coordinator, redis_client, namespace, pool,
                                     view, shown, not_shown):
    """``kafka-consumer-groups --describe --group G`` takes one of ``--state``, ``--members``,
    ``--offsets`` (the default) and prints that table alone; scripts written for it pass one.
    Here each was "unrecognized option" (exit 2), and the one view printed is all three
    tables."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    stable_group(coord, pool, "g", "t", {"c1": [0]})
    res = ok(cli("groups", "describe", "g", view))
    assert shown in res.stdout
    assert not_shown not in res.stdout


@pytest.mark.parametrize("backend", ["single"])
def test_consume_print_offset_uses_the_key_separator(cli, redis_client, namespace):
    """Kafka's DefaultMessageFormatter writes ``key.separator`` after every field it prints
    (``Partition:``, ``Offset:``, the key), not only between key and value: ``--property
    print.offset=true --property key.separator=,`` prints ``Offset:0,v``. Here, without
    ``--print-key``, the separator given was dropped for a tab ("Partition:0\\tOffset:0\\tr0"),
    so a script splitting on the separator it asked for read one field."""
    Topics(redis_client, namespace).create("t", 1)
    produce(redis_client, namespace, "t", {0: 1})
    res = ok(cli("topics", "consume", "t", "--partition", "0", "--offset", "0",
                 "--max-messages", "1", "--print-offset", "--key-separator", ","))
    assert res.stdout.splitlines() == ["Partition:0,Offset:0,r0"]
