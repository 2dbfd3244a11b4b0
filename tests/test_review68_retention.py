"""Review 68: a retention pass that finds its leases unconfirmed at its start (9fbd393) logs
``retention_error`` with ``left`` 0, though it reached none of the topics due: "0 topics left"
reads as "nothing undone" (docs/operations.md: "the number of topics ``left``"), where the pass
did not even list them. The same pass with its leases lapsing just after the start says
``left`` 1 for the one topic (test_service_retention's midway test)."""

from __future__ import annotations

import threading

from test_service_retention import N, _keeper_passes, _produce, retention_log  # noqa: F401

from rcoord.service.metrics import Metrics
from rcoord.service.retention import RetentionKeeper
from rcoord.topics import Topics, log_offsets


def test_a_pass_unconfirmed_at_its_start_does_not_say_it_left_no_topic(
        single_client, namespace, retention_log):  # noqa: F811 - the fixture
    """One topic due (retention 1 record, 3 records): the pass trims nothing and is failed;
    its log line must not say 0 topics were left (the count is not known there: absent or
    None, or the due topics counted)."""
    Topics(single_client, namespace).create("l", 1, retention_records=1)
    _produce(single_client, namespace, "l", 3)
    metrics = Metrics()
    keeper = RetentionKeeper(single_client, namespace, N, metrics, lambda: None, 60_000,
                             threading.Event(), "c1")
    assert keeper.run_once() == 0
    assert log_offsets(single_client, namespace, "l", 0) == (0, 3)  # the topic was left
    assert _keeper_passes(metrics, "failed") == 1
    lefts = [getattr(r, "left", "absent") for r in retention_log.errors]
    assert len(lefts) == 1 and lefts[0] != 0, lefts
