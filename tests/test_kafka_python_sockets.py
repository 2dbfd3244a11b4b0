"""The suite's patch to kafka-python (tests/kafka_python_sockets.py): a connect that does not
finish closes its socket, so no unclosed-socket ResourceWarning surfaces in a later test.
Without the patch each case below leaves one (checked by calling ``install`` off)."""

from __future__ import annotations

import contextlib
import gc
import socket
from collections.abc import Iterator
from typing import Any

import pytest

kafka_net = pytest.importorskip("kafka.net.inet")
kafka_selector = pytest.importorskip("kafka.net.selector")

import kafka.errors
import kafka_python_sockets
from harness import socket_warnings, socket_warnings_on_collect


@pytest.fixture
def net() -> Iterator[Any]:
    socket_warnings_on_collect()  # what earlier tests left: not this test's to judge
    selector = kafka_selector.NetworkSelector()
    try:
        yield selector
    finally:
        selector.close()


def test_the_patch_is_installed_for_the_whole_suite() -> None:
    assert kafka_python_sockets.install()
    wrapped = kafka_net.KafkaNetSocket.sock_connect
    assert getattr(wrapped, kafka_python_sockets._INSTALLED)


def test_a_refused_connect_closes_its_socket(net: Any, refused_port: int) -> None:
    with pytest.raises(kafka.errors.KafkaConnectionError):
        net.run(kafka_net.create_connection, net, "127.0.0.1", refused_port)
    assert socket_warnings_on_collect() == []


def test_a_connect_abandoned_when_the_client_closes_closes_its_socket(net: Any) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        connecting = kafka_net.create_connection(net, "127.0.0.1", server.getsockname()[1])
        connecting.send(None)  # now waiting for the socket to be writable
        with socket_warnings() as found:
            connecting.close()  # what a closing client's selector does to a pending task
            del connecting
            gc.collect()
        assert found == []


def test_a_connect_that_succeeds_keeps_its_socket_open(net: Any) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        sock = net.run(kafka_net.create_connection, net, "127.0.0.1", server.getsockname()[1])
        try:
            assert sock.fileno() >= 0
            assert sock.getpeername() == server.getsockname()
        finally:
            sock.close()


def _drop_in_a_cycle(sock: socket.socket) -> None:
    """Leave ``sock`` unclosed where only a garbage collection finds it, as a client that drops
    a connection inside a reference cycle does."""
    holder: dict[str, Any] = {"sock": sock}
    holder["self"] = holder


def test_a_stopping_gateway_reports_the_sockets_a_test_left_except_kafka_clients(
        redis_server: Any, namespace: str) -> None:
    """The gateway harness collects garbage as it stops (tests/gateway_harness.py): a dropped
    socket connected to a running gateway is a Kafka client library's and is let go; any other
    fails the test that dropped it, instead of whichever test the next collection runs in."""
    from gateway_harness import GatewayThread, excused_gateways

    socket_warnings_on_collect()  # what earlier tests left: not this test's to judge
    with contextlib.ExitStack() as stack:
        elsewhere = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        while elsewhere.getsockname() in excused_gateways():  # (a port used again)
            elsewhere = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        gw = GatewayThread(redis_server.url, namespace).start()
        _drop_in_a_cycle(socket.create_connection(gw.address))
        gw.stop()  # let go: a client's socket to the gateway
        gw = GatewayThread(redis_server.url, namespace).start()
        _drop_in_a_cycle(socket.create_connection(elsewhere.getsockname()))
        with pytest.raises(AssertionError, match="unclosed sockets left by this test") as caught:
            gw.stop()
        assert str(elsewhere.getsockname()[1]) in str(caught.value)
    assert socket_warnings_on_collect() == []
