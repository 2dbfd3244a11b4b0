"""Review 73 of the last session's client and CLI commits, as a user of Kafka's Java consumer
and its command-line tools. Each test fails on the code it was written against, showing a
defect the reviewer found."""

from __future__ import annotations

from typing import Any

import pytest
import test_cli_groups
from test_cli_groups import ok
from test_consumer import env  # noqa: F401 - env: the fixture
from test_review72_durations import refused_or_commits
from test_topics_review64_marked import _stopped_delete

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize("group", [[], ["--group", "g"]])
def test_consume_timeout_ms_too_large_for_a_deadline_is_a_usage_error(
        cli: Any, group: list[str]) -> None:
    """``--timeout-ms`` is read by ``integer`` (any number of digits) and turned into a
    deadline by ``timeout_ms / 1000`` (``_idle_deadline``): a number past a float's range
    (Kafka's console consumer reads the option as a Long and refuses any past Long.MAX: "Cannot
    parse argument") failed before a record was printed, with 'Processed a total of 0
    messages' and 'unexpected OverflowError: integer division result too large for a float',
    exit 1, naming no option. A number the command cannot wait is a bad flag (exit 2), naming
    it."""
    ok(cli("topics", "create", "t", "--partitions", "1"))
    ok(cli("topics", "produce", "t", stdin="a\n"))
    res = cli("topics", "consume", "t", *group, "--from-beginning", "--max-messages", "1",
              "--timeout-ms", "1" + "0" * 400)
    assert "unexpected" not in res.stderr, res.stderr
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--timeout-ms" in res.stderr, res.stderr


@pytest.mark.parametrize(("name", "value"), [("retention_ms", 2**63),
                                            ("commit_required_acks", 2**31)])
def test_group_numbers_every_commit_refuses_are_refused_at_construction_or_work(
        env: Any, name: str, value: int) -> None:  # noqa: F811 - the fixture
    """9010c89 bounded the group's durations at construction so that a value the consumer
    cannot use is a ConfigError naming it, not a later failure. ``retention_ms`` and
    ``commit_required_acks`` were left checked only for >= 0 (config.py:191-198): 2**63
    (past Kafka's Long retention, which no Java client can send) and 2**31 replicas are taken,
    and then every commit fails, with InvalidRequestError 'retention_ms 9223372036854775808
    is outside int64' ('required_acks 2147483648 is outside int32'), the auto-commits and
    close()'s final commit only logged: the group runs and commits nothing. Refused at
    construction (as ConfigError naming the setting) it would be a clear error instead."""
    refused_or_commits(env, name, value)


@pytest.mark.parametrize("backend", ["single"])
def test_consume_as_a_group_commits_nothing_to_a_topic_marked_for_deletion(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """665c6ca and 3b7ee9b made produce, reset-offsets, delete-records and alter-configs
    refuse a topic whose delete stopped partway: the delete that finishes it throws away what
    they write, or a topic created again under its name seems to have it. ``topics consume
    --group`` was left out (console.py ``_consume`` never calls
    ``refuse_marked_for_deletion``): on t (partition 0 removed, partition 1 holding 'old') it
    printed 'old', exit 0, and committed t-0 at 0 and t-1 at 1: the offsets reset-offsets is
    refused to write, one of them for a partition that no longer exists (Kafka's broker
    answers an OffsetCommit for it UNKNOWN_TOPIC_OR_PARTITION), kept through ``topics delete
    t`` and ``topics create t``. Refused as the others, it commits nothing."""
    coord = make_coordinator()
    _stopped_delete(redis_client, namespace, monkeypatch)
    res = cli("topics", "consume", "t", "--group", "g", "--from-beginning",
              "--max-messages", "1", "--timeout-ms", "30000")
    assert coord.fetch_offsets("g").offsets == {}, res.stdout + res.stderr
    assert res.returncode == 1, res.stdout + res.stderr
    assert "'t' is marked for deletion" in res.stderr, res.stderr
