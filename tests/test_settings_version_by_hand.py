"""A settings hash whose ``version`` was edited by hand into no integer."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord import ConfigError, CoordinatorConfig, GroupCoordinator
from rcoord.keys import settings_key
from rcoord.settings import anchor_keys, copy_pattern


def _drop_copies(client: Any, namespace: str) -> None:
    for key in [*client.scan_iter(match=copy_pattern(namespace), count=1000),
                *anchor_keys(namespace)]:
        client.delete(key)


@pytest.mark.parametrize("named", [{}, {"group_max_size": 5}])
def test_a_stored_version_that_is_no_integer_is_named(redis_client, namespace, named):
    """With no copy to restore it from, a start failed with int()'s bare ValueError (and a
    start naming a setting would have met the script's HINCRBY error): the error now names
    the key, the field and what to write there, and nothing is written."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    key = settings_key(namespace)
    redis_client.hset(key, "version", "abc")
    _drop_copies(redis_client, namespace)
    before = redis_client.hgetall(key)
    with pytest.raises(ConfigError, match=r"stored setting version of namespace .* is 'abc', "
                       r"not an integer, .*\(HSET .*:settings version 1\)"):
        GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **named)).start()
    assert redis_client.hgetall(key) == before
    redis_client.hset(key, "version", "1")
    started = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                               **named)).start()
    assert started.config.group_max_size == named.get("group_max_size", 2**31 - 1)


def test_a_stored_version_that_is_no_integer_is_restored_from_the_copies(
        redis_client, namespace):
    """With the copies there, the newest one's version is adopted (as for a hash rolled back
    below its copies): the start needs no hand."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    key = settings_key(namespace)
    redis_client.hset(key, "version", "abc")
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert redis_client.hget(key, "version") == b"1"
