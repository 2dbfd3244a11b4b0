"""The operator's commands when things go wrong while they run: Redis going away between the
steps of a command must leave the output saying what was done before it went, next to the one
error line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from test_cli_errors import one_error_line
from test_cli_groups import run_in_process

from rcoord import GroupCoordinator, TopicPartition
from rcoord.config import CoordinatorConfig
from rcoord.testing.embedded import EmbeddedServer


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("RCOORD_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def server_with_groups(own_server: EmbeddedServer, namespace: str,
                       no_env: None) -> Iterator[EmbeddedServer]:
    """A server whose namespace holds three Empty groups, "a", "b" and "c"."""
    with own_server.client() as client:
        coord = GroupCoordinator(client, CoordinatorConfig(namespace=namespace)).start()
        for group in ("a", "b", "c"):
            coord.commit_offsets(group, {TopicPartition("t", 0): 1})
    yield own_server


@pytest.mark.parametrize("output", ["table", "json"])
def test_groups_deleted_before_redis_went_away_are_reported(
        server_with_groups: EmbeddedServer, namespace: str, output: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``groups delete a b c`` deletes group by group; when Redis goes away after "a" went,
    the output still says that "a" was deleted (as ``topics delete`` does), beside the error.
    Before, it said nothing of it: a script (or a person) took the whole command for undone,
    and the run again refused "a" as GROUP_ID_NOT_FOUND."""
    server = server_with_groups
    real = GroupCoordinator.delete_groups

    def stop_after_the_first(self: GroupCoordinator, ids: Any) -> Any:
        out = {}
        for gid in ids:
            if gid == "b":
                server.stop()  # Redis goes away after "a" was deleted
            out.update(real(self, [gid]))
        return out

    monkeypatch.setattr(GroupCoordinator, "delete_groups", stop_after_the_first)
    res = run_in_process(["groups", "delete", "a", "b", "c", "--redis-url", server.url,
                          "--namespace", namespace, "--output", output])
    assert res.returncode == 1
    assert "cannot reach Redis" in one_error_line(res, "groups delete")
    if output == "json":
        assert json.loads(res.stdout)["deleted"] == ["a"]
    else:
        assert res.stdout.strip() == ("Deletion of requested consumer groups ('a') was "
                                      "successful.")
