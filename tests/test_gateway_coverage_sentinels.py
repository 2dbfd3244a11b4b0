"""The fields of a gateway error answer that Kafka sets to its "none" values (-1 ids and
epochs) beside the error code, so a client never reads a real-looking value from a refusal."""

from __future__ import annotations

from gateway_harness import INIT_PRODUCER_ID_BODY, call_once, demoted, running_gateway

from rcoord.errors import Errors
from rcoord.gateway.error_responses import request_error_response
from rcoord.gateway.wire import build, response_class

INIT_PRODUCER_ID = 22


def test_init_producer_id_failed_as_a_whole_has_no_producer_id_nor_epoch():
    """Kafka's ``InitProducerIdRequest.getErrorResponse`` answers producer id -1 and epoch -1
    (``NO_PRODUCER_EPOCH``); the gateway's answer carried epoch 0, the first real epoch."""
    for version in range(6):
        body = request_error_response(INIT_PRODUCER_ID, version, None,
                                      Errors.COORDINATOR_LOAD_IN_PROGRESS)
        assert body is not None
        answer = build(response_class(INIT_PRODUCER_ID, version), body)
        assert (answer.error_code.value, answer.producer_id, answer.producer_epoch) == (
            Errors.COORDINATOR_LOAD_IN_PROGRESS, -1, -1)


def test_init_producer_id_while_redis_refuses_writes_answers_epoch_minus_one(
        own_server, namespace, refused_port):
    """The same through a gateway whose Redis cannot allocate an id (a master demoted to a
    replica, as a failover does)."""
    admin = own_server.client()
    try:
        with running_gateway(own_server, namespace) as gw, demoted(admin, refused_port):
            during = call_once(gw, INIT_PRODUCER_ID, 4, INIT_PRODUCER_ID_BODY)
    finally:
        admin.close()
    assert (during.error_code.value, during.producer_id, during.producer_epoch) == (
        Errors.COORDINATOR_LOAD_IN_PROGRESS, -1, -1)
