"""Review of c47cbff (``ClusterClient.one_operation``): inside the scope, every call's failed
attempt counts for the whole operation, and ``_execute_command`` counts any error but a
refusal as "may have run", a NOSCRIPT reply included. So the gateway's append whose first
EVALSHA found the script missing (a failover's new master has an empty script cache: nothing
ran) and whose resend after the reload a slot move refused throughout is no longer marked
refused unrun: it is answered REQUEST_TIMED_OUT ("maybe written") for a batch certainly not
stored, where 8a8a728 answered NOT_LEADER_OR_FOLLOWER (judged alone, the resend was marked)."""

from __future__ import annotations

from typing import Any

from test_producer_slot_moves import _migrate, _start
from test_review69b_refused_unrun import produce_through

from rcoord.connect import ClusterClient
from rcoord.gateway.errors import NOT_LEADER_OR_FOLLOWER


class _ScriptsGone(ClusterClient):
    """The first EVALSHA meets an empty script cache (NOSCRIPT: nothing ran); the EVALSHA
    after the reload meets a slot move that splits its keys (``TRYAGAIN`` to "TTL
    exhausted")."""

    move: Any = None
    evalshas = 0

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if args[0] == "EVALSHA":
            self.evalshas += 1
            if self.evalshas == 1:
                for node in self.move.nodes.values():
                    node.script_flush()
            elif self.evalshas == 2:  # (the one after the reload)
                _start(self.move)
                _migrate(self.move, [self.move.key])
        return super().execute_command(*args, **kwargs)


def test_an_append_refused_after_a_noscript_reload_is_not_leader(own_cluster, namespace):
    """Fails now: REQUEST_TIMED_OUT for an append nothing of which ran (the NOSCRIPT reply
    counted as an attempt that may have run, for the whole operation)."""
    answer, values = produce_through(own_cluster, namespace, _ScriptsGone)
    assert values == [b"a"]  # nothing of it stored
    # Certainly not stored: "not stored", as an append refused throughout.
    assert answer.error_code.value == NOT_LEADER_OR_FOLLOWER, answer.error_message
