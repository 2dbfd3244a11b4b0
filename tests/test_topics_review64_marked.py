"""A topic whose ``delete`` stopped partway (its process died, Redis went away) is marked for
deletion (``deleting`` in its metadata) until a ``delete`` finishes it, and is still listed and
described, as Kafka lists a topic marked for deletion. ``describe`` says so
(``TopicDescription.marked_for_deletion``; Kafka's ``MarkedForDeletion: true``), and so does
``rcoord topics describe``: a note on stderr saying what finishes it, and
``marked_for_deletion`` in its JSON. Before, the partitions the delete removed were bare
UNKNOWN_TOPIC_OR_PARTITION rows with no word of why or what to do."""

from __future__ import annotations

import json
from typing import Any

import pytest
import test_cli_groups
from test_cli_groups import ok, rows
from test_topics import _delete_stopped_after_partition_0

from rcoord.topics import Producer, ProducerRecord, Topics

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


def _stopped_delete(redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Topic t of 2 partitions, one record each, whose delete removed partition 0 and then
    stopped (as test_topics' delete that stopped partway); topic u, whole."""
    topics = Topics(redis_client, namespace)
    topics.create("t", 2)
    topics.create("u", 1)
    Producer(redis_client, namespace).send_batch(
        "t", [ProducerRecord(b"old", partition=p) for p in (0, 1)])
    _delete_stopped_after_partition_0(topics, monkeypatch)


@pytest.mark.parametrize("backend", ["single"])
def test_describe_marks_a_topic_whose_delete_stopped_partway(
        cli: Any, redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _stopped_delete(redis_client, namespace, monkeypatch)
    topics = Topics(redis_client, namespace)
    assert topics.describe("t").marked_for_deletion
    assert not topics.describe("u").marked_for_deletion
    for args in ([], ["t"], ["t", "--output", "json"]):
        res = ok(cli("topics", "describe", *args))
        notes = [line for line in res.stderr.splitlines() if "marked for deletion" in line]
        assert len(notes) == 1 and ": t: marked for deletion" in notes[0], res.stderr
        assert "rcoord topics delete t" in notes[0]
    doc = json.loads(ok(cli("topics", "describe", "--output", "json")).stdout)
    assert [(d["topic"], d["marked_for_deletion"]) for d in doc] == [("t", True), ("u", False)]
    assert rows(ok(cli("topics", "describe", "t")).stdout, "TOPIC PARTITION") == [
        ["t", "0", "-1", "-1", "UNKNOWN_TOPIC_OR_PARTITION"], ["t", "1", "0", "1", "-"]]
    ok(cli("topics", "delete", "t"))
    res = ok(cli("topics", "describe"))
    assert "marked for deletion" not in res.stderr
