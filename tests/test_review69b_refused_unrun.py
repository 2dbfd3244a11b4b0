"""Review of 8a8a728 (``refused_unrun``): the mark judges each ``execute_command`` alone, but
one topic script call can be several of them (``_Lua``'s NOSCRIPT reload sends EVALSHA
again), so an append whose first EVALSHA ran and lost its reply, then found the script missing
(a failover's new master has an empty script cache), and whose EVALSHA after the reload a slot
move refused throughout, is marked refused unrun: the gateway answers NOT_LEADER_OR_FOLLOWER,
"nothing was appended", for a batch that is stored, and a plain producer resends it."""

from __future__ import annotations

import contextlib
from typing import Any

import redis
from gateway_harness import connect, running_gateway
from test_gateway_tryagain69 import _produce, _split
from test_producer_slot_moves import _migrate, _start

from rcoord.connect import ClusterClient
from rcoord.errors import Errors
from rcoord.topics.fetch import fetch


class _ReplyLost:
    """A node's client whose reply to the call in flight is lost after the call ran."""

    def __init__(self, node: Any, ran: Any) -> None:
        self._node, self._ran = node, ran

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    def parse_response(self, connection: Any, command: Any, **options: Any) -> Any:
        self._node.parse_response(connection, command, **options)
        self._ran(self._node)
        raise redis.exceptions.ConnectionError("reply lost")


class _FailedOver(ClusterClient):
    """The first EVALSHA runs and its reply is lost, with the node's scripts gone (as the new
    master of a failover answers the retry: NOSCRIPT); the EVALSHA after the reload meets a
    slot move that splits its keys (``TRYAGAIN`` to "TTL exhausted")."""

    move: Any = None
    sending: Any = None
    evalshas = 0

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if args[0] == "EVALSHA":
            self.evalshas += 1
            if self.evalshas == 2:  # (the one after the reload)
                _start(self.move)
                _migrate(self.move, [self.move.key])
        return super().execute_command(*args, **kwargs)

    def _execute_command(self, target_node: Any, *args: Any, **kwargs: Any) -> Any:
        self.sending = args[0]
        return super()._execute_command(target_node, *args, **kwargs)

    def get_redis_connection(self, node: Any) -> Any:
        real = super().get_redis_connection(node)
        if self.sending == "EVALSHA" and self.evalshas == 1:
            self.sending = None
            return _ReplyLost(real, lambda n: n.script_flush())
        return real


def produce_through(cluster: Any, namespace: str, client_class: type) -> tuple[Any, list[Any]]:
    """A Produce of "a", then one of "b" through the gateway whose cluster client is of
    ``client_class`` (given the slot move, counting its EVALSHAs: two expected, the second
    after a reload): the second's answer, and the values in the log after the move ended."""
    with _split(cluster, namespace) as (client, move), \
            running_gateway(cluster, namespace) as gw, \
            contextlib.closing(connect(gw)) as sock:
        assert _produce(sock, 1, b"a").error_code.value == 0
        assert gw.gateway is not None
        sync = gw.gateway.state.sync_redis
        sync.__class__ = client_class
        sync.move = move
        answer = _produce(sock, 2, b"b")
        sync.__class__ = ClusterClient
        assert sync.evalshas == 2  # (the first failed one way or another; a reload; the resend)
        move.keys()
        move.owner()
        return answer, [r.value for r in fetch(client, namespace, "t", 0, 0).records]


def test_a_stored_append_whose_resend_after_a_reload_a_move_refused_is_not_not_stored(
        own_cluster, namespace):
    """Fails now: 6 (NOT_LEADER_OR_FOLLOWER, "nothing was appended") for a batch stored."""
    answer, values = produce_through(own_cluster, namespace, _FailedOver)
    assert values == [b"a", b"b"]  # stored by the first EVALSHA
    # Stored, so "maybe written" at best; NOT_LEADER_OR_FOLLOWER makes it resent.
    assert answer.error_code.value == Errors.REQUEST_TIMED_OUT, answer.error_message
