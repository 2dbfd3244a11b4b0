"""Review 71 of the Spark data source against Spark's Kafka source: reproductions of defects.

Each test fails on the code it was written against; none needs a JVM.
"""

from __future__ import annotations

from typing import Any

import pytest

from rcoord.spark.options import OptionError, ReadKind, parse_read_options
from rcoord.topics import Topics

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]

JAVA_LONG_MAX = 2 ** 63 - 1
"""What a Java user writes for "no limit": Kafka's ``max.poll.interval.ms`` (which
``rebalanceTimeoutMs`` stands for) is an INT, and Kafka's client refuses a larger value with a
ConfigException naming it."""


def test_a_rebalance_timeout_too_large_is_an_option_error_naming_it(
        redis_server: Any, single_client: Any, namespace: str) -> None:
    source = pytest.importorskip("rcoord.spark.source")  # pyspark, but no JVM
    Topics(single_client, namespace).create("ev", 1)
    opts = {"url": redis_server.url, "namespace": namespace, "subscribe": "ev", "groupId": "g",
            "sessionTimeoutMs": "6000", "heartbeatIntervalMs": "300",
            "rebalanceTimeoutMs": str(JAVA_LONG_MAX)}
    reader = None
    try:
        with pytest.raises(OptionError, match="^rebalanceTimeoutMs"):
            # Before: parsed and joined, then initialOffset's wait for the first generation
            # ((rebalance + session timeout) / 1000 + 5 s) raised "OverflowError: timestamp
            # out of range for platform time_t", naming no option.
            reader = source.StreamReader(parse_read_options(opts, ReadKind.STREAM, env={}))
            reader.initialOffset()
    finally:
        if reader is not None:
            reader.stop()
