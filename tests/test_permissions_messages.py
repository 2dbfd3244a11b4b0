"""A refused key or channel names the pattern to grant: the server's words ("No permissions to
access a key") do not say which key, nor what rule would mend it."""

from __future__ import annotations

import uuid

import pytest
import redis

from rcoord.errors import MissingPermissionError, as_missing_permission
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Topics

RULES = "add the missing rule to its ACL rules (docs/security.md lists the rules of each role)"


@pytest.mark.parametrize(("error", "rule"), [
    (redis.exceptions.NoPermissionError("No permissions to access a key"), "~{}:*"),
    # Redis 7.0's words
    (redis.exceptions.NoPermissionError(
        "this user has no permissions to access one of the keys used as arguments"), "~{}:*"),
    # met inside a function: a plain error
    (redis.exceptions.ResponseError("ACL failure in script: No permissions to access a key "
                                    "script: topic_append, on @user_function:4."), "~{}:*"),
    (redis.exceptions.NoPermissionError("No permissions to access a channel"), "&{}:*"),
    (redis.exceptions.ResponseError("ACL failure in script: No permissions to access a channel "
                                    "script: 0123abcd, on @user_script:1."), "&{}:*"),
], ids=["key", "key-redis-7.0", "key-in-function", "channel", "channel-in-script"])
def test_a_refused_key_or_channel_names_the_pattern_to_grant(error: Exception,
                                                             rule: str) -> None:
    """The namespace filled in when the caller knows it, a placeholder when it does not."""
    told = str(as_missing_permission(error, "orders"))
    assert f"must include {rule.format('orders')})" in told and "namespace 'orders'" in told
    assert told.endswith(RULES)
    general = str(as_missing_permission(error))
    assert rule.format("<namespace>") in general and "the namespace setting" in general


def test_a_refused_command_keeps_the_servers_words_which_name_it() -> None:
    error = redis.exceptions.NoPermissionError(
        "User w has no permissions to run the 'xadd' command")
    assert str(as_missing_permission(error, "orders")) == (
        "the Redis user may not do what rcoord needs: User w has no permissions to run the "
        f"'xadd' command; {RULES}")


def test_a_user_of_another_namespace_is_told_the_key_pattern(own_server: EmbeddedServer
                                                             ) -> None:
    """For real: a user whose key pattern is another namespace's, reading a topic."""
    admin = own_server.client()
    name = "u" + uuid.uuid4().hex[:8]
    admin.execute_command("ACL", "SETUSER", name, "on", ">pw", "resetkeys", "~elsewhere:*",
                          "+@all")
    user = redis.Redis.from_url(own_server.url.replace("redis://", f"redis://{name}:pw@"))
    try:
        with pytest.raises(MissingPermissionError) as raised:
            Topics(user, "orders").describe("t")
        text = str(raised.value)
        assert "No permissions to access a key" in text
        assert "the user's key patterns must include ~<namespace>:*" in text
    finally:
        user.close()
        admin.execute_command("ACL", "DELUSER", name)
        admin.close()


def test_one_made_without_the_namespace_is_made_again_with_it() -> None:
    """rcoord's boundary (``reraise_as_rcoord``) does not know the namespace; a caller that
    does (the gateway) gets it filled in."""
    server = redis.exceptions.NoPermissionError("No permissions to access a key")
    first = as_missing_permission(server)
    again = as_missing_permission(first, "orders")
    assert "~orders:*" in str(again) and again.__cause__ is server
    assert as_missing_permission(first) is first
    plain = MissingPermissionError("the Redis user may not run CLUSTER SLOTS")
    assert as_missing_permission(plain, "orders") is plain


def test_a_user_that_may_not_load_the_library_is_told_both_ways_out(
        own_server: EmbeddedServer) -> None:
    """docs/security.md: where tenants must not load code, their users lack +function|load
    and an operator loads the library. A server without it (a restart, FUNCTION FLUSH) then
    refuses such a user's first call; "add +function|load" alone sent the tenant the wrong
    way. The message names both."""
    from rcoord import CoordinatorConfig, GroupCoordinator

    admin = own_server.client()
    name = "u" + uuid.uuid4().hex[:8]
    admin.execute_command("ACL", "SETUSER", name, "on", ">pw", "~*", "&*", "+@all",
                          "-function|load")
    admin.function_flush()
    user = redis.Redis.from_url(own_server.url.replace("redis://", f"redis://{name}:pw@"))
    try:
        with pytest.raises(MissingPermissionError) as raised:
            GroupCoordinator(user, CoordinatorConfig(namespace="orders")).start()
        text = str(raised.value)
        assert "run the 'function|load' command" in text
        assert "grant +function|load, or" in text
        assert "rcoord.scripts.library_source()" in text and "FUNCTION LOAD REPLACE" in text
    finally:
        user.close()
        admin.execute_command("ACL", "DELUSER", name)
        admin.close()
