"""Review 73 of the last session's client and CLI commits, as a user of Kafka's Java consumer
and its command-line tools. Each test fails on the code it was written against, showing a
defect the reviewer found."""

from __future__ import annotations

from typing import Any

import pytest
import test_cli_groups
from test_cli_groups import ok

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
