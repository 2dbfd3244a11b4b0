"""rcoord's cluster clients while one slot is served by no master (a master lost with no replica
to promote, under ``cluster-require-full-coverage no``): the covered slots are still served, as
Kafka keeps serving the partitions whose leaders are up, on a cluster of the module's own."""

from __future__ import annotations

import pytest
import redis.exceptions
from test_gateway_slot_moves import _unserved

from rcoord.connect import connect

UNSERVED, COVERED = "unserved-key", "covered-key"


def test_a_client_connects_and_serves_the_covered_slots_while_one_is_not(own_cluster):
    """redis-py's default ``require_full_coverage=True`` refused to start a cluster client while
    any slot was unserved ("All slots are not covered"): a worker, the service, the gateway and
    the CLI could not connect at all, and a running client's topology refresh (after a failover
    or MOVED) failed the same way, so it never learned the new owners of the covered slots. A
    call to the unserved slot is refused with redis-py's retriable cluster errors
    (CLUSTERDOWN, then SlotNotCoveredError), which rcoord answers as ConnectionLost."""
    probe = own_cluster.client()
    try:
        assert probe.keyslot(UNSERVED) != probe.keyslot(COVERED)
    finally:
        probe.close()
    with _unserved(own_cluster, UNSERVED):
        client = connect(own_cluster.url, socket_timeout=5)
        try:
            assert client.set(COVERED, b"v") is True
            assert client.get(COVERED) == b"v"
            client.nodes_manager.initialize()  # a topology refresh, as a failover makes
            assert client.get(COVERED) == b"v"
            with pytest.raises((redis.exceptions.ClusterDownError,
                                redis.exceptions.SlotNotCoveredError)):
                client.get(UNSERVED)
        finally:
            client.close()


def test_require_full_coverage_may_still_be_asked_for(own_cluster):
    """A caller that wants redis-py's refusal passes ``require_full_coverage=True``."""
    with _unserved(own_cluster, UNSERVED), pytest.raises(
            redis.exceptions.RedisClusterException, match="not covered"):
        connect(own_cluster.url, socket_timeout=5, require_full_coverage=True)
