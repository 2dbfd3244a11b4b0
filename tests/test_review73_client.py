"""Review 73 of the last session's client and CLI commits, as a user of Kafka's Java consumer
and its command-line tools. Each test fails on the code it was written against, showing a
defect the reviewer found."""

from __future__ import annotations

from typing import Any

import pytest
import test_cli_groups
from test_cli_groups import ok
from test_consumer import env  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.errors import ConfigError

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli
TP = TopicPartition("t", 0)


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
    env.topics.create("t", 1)
    try:
        consumer = env.consumer(topics=[], **{name: value})
    except ConfigError as exc:
        assert name in str(exc)
        return
    try:
        consumer.assign([TP])
        consumer.commit({TP: 0})
        assert consumer.committed([TP]) == {TP: 0}
    finally:
        consumer.close(timeout=0)
