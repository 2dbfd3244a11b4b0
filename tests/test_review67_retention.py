"""Review 67: a retention pass that the stop cuts short is no longer counted ok (808f4f0), but
the topic whose trim the stop cut short (``apply_retention`` ends between its rounds) is still
counted as applied: ``rcoord_retention_topics_applied`` goes up, ``run_once`` counts it and the
debug log says ``retention_applied``, though records past its retention are left."""

from __future__ import annotations

from test_service_retention import _produce, _stopping_before_first_topic
from test_service_review64_retention import _passes

from rcoord.service.metrics import Metrics
from rcoord.topics import Topics, log_offsets
from rcoord.topics import admin as topics_admin


def test_a_topic_whose_trim_the_stop_cut_short_is_not_counted_applied(
        single_client, namespace, monkeypatch):
    """20 records, retention 1, removed about one record a round (RETENTION_TRIM_BYTES 1):
    the stop comes just before the topic's trim, which ends after its first round."""
    Topics(single_client, namespace).create("s", 1, retention_records=1)
    _produce(single_client, namespace, "s", 20)
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 1)
    metrics = Metrics()
    keeper, _ = _stopping_before_first_topic(single_client, namespace, metrics)
    applied = keeper.run_once()
    start, end = log_offsets(single_client, namespace, "s", 0)
    assert end == 20 and start < 19  # cut short: records past the retention are left
    assert _passes(metrics, "ok") == 0  # (808f4f0)
    topics_applied = metrics.registry.get_sample_value("rcoord_retention_topics_applied_total")
    assert (applied, topics_applied or 0.0) == (0, 0.0)
