"""Review 73: the gateway driven by real Kafka clients, where it answers otherwise than Kafka.

Each test here failed on the code it was written against (see the review's report)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")

from rcoord.topics import Topics


def test_incremental_delete_of_a_config_rcoord_does_not_have_is_a_no_op(
        gateway: Any, topics: Topics) -> None:
    """Kafka's controller validates a topic's configs as they are after the change
    (``ConfigurationControlManager.validateAlterConfig`` removes a DELETEd name before
    ``LogConfig.validate``), so deleting a config the topic does not set, also one the broker
    does not know, succeeds and changes nothing. Tools that bring a topic to a desired set of
    configs (``kafka-configs --delete-config segment.bytes``, Terraform's provider) send such
    DELETEs; refusing them INVALID_CONFIG fails the whole resource, its SETs too."""
    from test_gateway_alter_configs import set_retention_and_delete

    topics.create("t", 1)
    _, entries = set_retention_and_delete(gateway, "t", "segment.bytes")
    assert entries["retention.ms"].value == "60000"
    assert "segment.bytes" not in entries
