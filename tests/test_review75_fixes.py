"""Review of this session's fixes (round 75): reproductions of the defects found."""

from __future__ import annotations

import pytest

from rcoord.cli import UsageError
from rcoord.ops.reset import parse_datetime

T0 = 1_714_521_600_000  # 2024-05-01T00:00:00.000Z


@pytest.mark.parametrize(("text", "kafkas"), [
    # Kafka's Utils.getDateTime tries ``yyyy-MM-dd'T'HH:mm:ss.SSSXXX`` (``+hh:mm``), then
    # ``...SSSX``, whose X is ``+hh`` alone: SimpleDateFormat.parse(String) ignores what
    # follows, so ``+0230`` is +02:00 there (checked with Java 17's SimpleDateFormat:
    # 2024-05-01T02:30:00.000+0230 -> 2024-05-01T00:30:00Z).
    ("2024-05-01T02:30:00.000+0230", T0 + 30 * 60_000),
    ("2024-05-01T05:30:00.000+0530", T0 + 30 * 60_000),
    ("2024-04-30T18:30:00.000-0530", T0 - 30 * 60_000),
])
def test_to_datetime_hhmm_zone_is_not_read_otherwise_than_kafka(text, kafkas):
    """The same ``--to-datetime`` given to Kafka's tool and to rcoord's must not reset to two
    instants half an hour apart: rcoord either refuses ``+hhmm`` with minutes, or reads it as
    Kafka does."""
    try:
        got = parse_datetime(text)
    except UsageError:
        return
    assert got == kafkas, f"{text}: rcoord {got - T0:+} ms from T0, Kafka {kafkas - T0:+}"
