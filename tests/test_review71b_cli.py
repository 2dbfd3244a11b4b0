"""Review 71b: ``ops.common.integer`` (c5a8ca2) for every number option.

Kafka's tools read a number option with ``Long.valueOf``/``Integer.valueOf`` (joptsimple's
``ofType``), which take a leading '+': ``kafka-consumer-groups --reset-offsets --shift-by +5``
shifts forward by 5. Before c5a8ca2 ``int()`` took it too; now it is a usage error, so a
script that writes the sign of a shift (``--shift-by -5`` is accepted) stops working."""

from __future__ import annotations

from test_cli_errors import rcoord


def test_shift_by_takes_an_explicit_plus_sign() -> None:
    """The number accepted, the command goes on to connect (nothing listens at the URL): exit
    1 "cannot reach Redis", as with ``--shift-by -5``, not exit 2 naming '+5'."""
    res = rcoord("groups", "reset-offsets", "g", "--topic", "t", "--shift-by", "+5",
                 env={"RCOORD_REDIS_URL": "redis://127.0.0.1:1"})
    assert "'+5' is not an integer" not in res.stderr, res.stderr
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert "cannot reach Redis" in res.stderr, res.stderr
