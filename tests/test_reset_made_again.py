"""``groups reset-offsets`` of a topic deleted (and perhaps made again, or only marked for
deletion) between the plan and the commit, in every mode: the plan's offsets are the old
topic's, and a commit of them, made after the new topic's creation, is taken for the new
topic's offsets.

The topic is changed deterministically at a step of the command (after ``plan``, or in the
commit call itself), never by timing."""

from __future__ import annotations

from typing import Any

import pytest
import redis.exceptions
import test_cli_groups
from test_cli_groups import committed, ok, produce

import rcoord.coordinator
import rcoord.ops.groups
from rcoord import TopicPartition
from rcoord.topics import Topics
from rcoord.topics._base import meta_key

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli

MODES = {
    "to-earliest": ["--to-earliest"],
    "to-latest": ["--to-latest"],
    "to-offset": ["--to-offset", "3"],
    "shift-by": ["--shift-by", "1"],
    "to-current": ["--to-current"],
    "from-file": ["--from-file", "{file}"],
}


def _setup(make_coordinator: Any, redis_client: Any, namespace: str,
           names: tuple[str, ...] = ("t",)) -> Any:
    """Group ``g`` (Empty) at offset 8 of each topic of ``names`` (1 partition, 10 records)."""
    coord = make_coordinator()
    topics = Topics(redis_client, namespace)
    for name in names:
        topics.create(name, 1)
        produce(redis_client, namespace, name, {0: 10})
    coord.commit_offsets("g", {TopicPartition(name, 0): 8 for name in names})
    return coord


def _change(redis_client: Any, namespace: str, topic: str, how: str) -> None:
    topics = Topics(redis_client, namespace)
    if how == "marked":
        redis_client.hset(meta_key(namespace, topic), "deleting", "1")  # (a delete's mark)
        return
    topics.delete(topic)
    if how == "made again":
        topics.create(topic, 1)
        produce(redis_client, namespace, topic, {0: 2})


def _after_plan(monkeypatch: pytest.MonkeyPatch, change: Any) -> None:
    real = rcoord.ops.groups.plan

    def planned(*args: Any, **kwargs: Any) -> Any:
        rows = real(*args, **kwargs)
        change()
        return rows

    monkeypatch.setattr(rcoord.ops.groups, "plan", planned)


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_reset_refuses_a_topic_made_again_after_the_plan(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, mode: str) -> None:
    """Only a reset by time compared the creation tokens; every other mode committed the old
    topic's planned offset (here 10, 0, 3, 9 or 8) to the new topic of 2 records."""
    coord = _setup(make_coordinator, redis_client, namespace)
    file = tmp_path / "plan.csv"
    file.write_text("t,0,3\n")
    _after_plan(monkeypatch, lambda: _change(redis_client, namespace, "t", "made again"))
    args = [a.format(file=file) for a in MODES[mode]]
    res = cli("groups", "reset-offsets", "g", *([] if mode == "from-file" else ["--topic", "t"]),
              *args, "--execute")
    assert res.returncode == 1, res.stdout + res.stderr
    assert ("topic 't' was deleted and created again while the reset read it; nothing was "
            "changed") in res.stderr, res.stderr
    assert committed(coord, "g") == {("t", 0): 8}


@pytest.mark.parametrize("backend", ["single"])
def test_a_dry_run_refuses_what_execute_refuses(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run shows the plan --execute would commit: not one of a topic gone since."""
    _setup(make_coordinator, redis_client, namespace)
    _after_plan(monkeypatch, lambda: _change(redis_client, namespace, "t", "deleted"))
    res = cli("groups", "reset-offsets", "g", "--topic", "t", "--to-latest")
    assert res.returncode == 1 and res.stdout == "", res.stdout + res.stderr
    assert "topic 't' was deleted while the reset read it; nothing was changed" in res.stderr


@pytest.mark.parametrize("backend", ["single"])
def test_the_refusal_names_every_topic_changed_and_one_marked_for_deletion(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal named only the first topic changed, and a topic marked for deletion (a
    delete begun, not finished: Kafka answers UNKNOWN_TOPIC_OR_PARTITION for it) was not seen
    at all: its planned offset was committed."""
    coord = _setup(make_coordinator, redis_client, namespace, ("a", "b", "c", "d"))

    def change() -> None:
        _change(redis_client, namespace, "a", "made again")
        _change(redis_client, namespace, "b", "deleted")
        _change(redis_client, namespace, "c", "marked")

    _after_plan(monkeypatch, change)
    res = cli("groups", "reset-offsets", "g", "--topic", "a", "--topic", "b", "--topic", "c",
              "--topic", "d", "--to-earliest", "--execute")
    assert res.returncode == 1, res.stdout + res.stderr
    assert ("topic 'a' was deleted and created again, topic 'b' was deleted, topic 'c' was "
            "marked for deletion while the reset read them; nothing was changed") \
        in res.stderr, res.stderr
    assert committed(coord, "g") == {(t, 0): 8 for t in "abcd"}


@pytest.mark.parametrize("backend", ["single"])
def test_only_a_marked_topic_is_refused_too(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    coord = _setup(make_coordinator, redis_client, namespace)
    _after_plan(monkeypatch, lambda: _change(redis_client, namespace, "t", "marked"))
    res = cli("groups", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--execute")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "topic 't' was marked for deletion while the reset read it; nothing was changed" \
        in res.stderr, res.stderr
    assert committed(coord, "g") == {("t", 0): 8}


def test_a_topic_made_again_during_the_commit_is_told(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit script runs in the group's slot and the creation token lives in the topic's,
    so no commit can check it atomically: a topic made again after the last check and before
    the commit is seen after it, and the command fails saying so (it said it committed)."""
    coord = _setup(make_coordinator, redis_client, namespace, ("t", "u"))
    real = rcoord.coordinator.GroupCoordinator.commit_offsets

    def made_again_first(self: Any, *args: Any, **kwargs: Any) -> Any:
        _change(redis_client, namespace, "t", "made again")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(rcoord.coordinator.GroupCoordinator, "commit_offsets", made_again_first)
    res = cli("groups", "reset-offsets", "g", "--topic", "t", "--topic", "u", "--to-earliest",
              "--execute")
    assert res.returncode == 1, res.stdout + res.stderr
    assert ("topic 't' was deleted and created again while the reset committed; the offsets "
            "were committed before that was seen") in res.stderr, res.stderr
    assert "run the reset again" in res.stderr
    assert "committed 2 offsets of group 'g'" in res.stderr  # (and the plan shows them)
    assert [line.split()[1:] for line in res.stdout.splitlines()[1:]] == [
        ["t", "0", "8", "0"], ["u", "0", "8", "0"]]
    monkeypatch.setattr(rcoord.coordinator.GroupCoordinator, "commit_offsets", real)
    # Run again, the reset plans and commits the new topic's offsets.
    ok(cli("groups", "reset-offsets", "g", "--topic", "t", "--topic", "u", "--to-latest",
           "--execute"))
    assert committed(coord, "g") == {("t", 0): 2, ("u", 0): 10}


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize("how", ["made again", "deleted", "marked"])
def test_a_topic_changed_after_the_commit_is_no_failure(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The reset committed to the topic it planned from; a delete after that makes the commit
    one of a deleted topic (older than a topic made again: none), as any consumer's commit. The
    check after the commit failed the command, telling the operator to run it again."""
    coord = _setup(make_coordinator, redis_client, namespace)
    real = rcoord.coordinator.GroupCoordinator.commit_offsets

    def changed_after(self: Any, *args: Any, **kwargs: Any) -> Any:
        errors = real(self, *args, **kwargs)
        _change(redis_client, namespace, "t", how)
        return errors

    monkeypatch.setattr(rcoord.coordinator.GroupCoordinator, "commit_offsets", changed_after)
    res = ok(cli("groups", "reset-offsets", "g", "--topic", "t", "--to-offset", "5",
                 "--execute"))
    assert "committed 1 offsets of group 'g'" in res.stderr
    assert committed(coord, "g") == {("t", 0): 5}


@pytest.mark.parametrize("backend", ["single"])
def test_a_failed_check_after_the_commit_says_the_offsets_were_committed(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check after the commit reads the creation tokens again; when that read fails, the
    error said only what failed (a lost connection), so an operator took the reset for undone,
    though the commit had landed. It now says the offsets were committed and that the check
    could not be made."""
    coord = _setup(make_coordinator, redis_client, namespace)
    real_commit = rcoord.coordinator.GroupCoordinator.commit_offsets
    real_token = Topics.create_token
    done: list[bool] = []

    def commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        errors = real_commit(self, *args, **kwargs)
        done.append(True)
        return errors

    def token(self: Any, topic: str) -> Any:
        if done:
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        return real_token(self, topic)

    monkeypatch.setattr(rcoord.coordinator.GroupCoordinator, "commit_offsets", commit)
    monkeypatch.setattr(Topics, "create_token", token)
    res = cli("groups", "reset-offsets", "g", "--topic", "t", "--to-offset", "5", "--execute")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "committed 1 offsets of group 'g'" in res.stderr
    assert ("the offsets were committed, but whether a topic was deleted or made again since "
            "the plan could not be checked") in res.stderr, res.stderr
    assert "Connection closed by server" in res.stderr, res.stderr
    assert committed(coord, "g") == {("t", 0): 5}
