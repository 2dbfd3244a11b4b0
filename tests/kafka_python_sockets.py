"""Close the sockets kafka-python 3.0.12 drops when a connection attempt does not finish.

kafka-python's ``KafkaNetSocket.connect`` makes a socket and awaits ``sock_connect`` on it, but
closes it on no path out other than success: a refused or timed-out connect, or a connect the
client abandons when it closes (its selector drops the pending coroutine), leaves the socket
for the garbage collector. The connection's task sits in a reference cycle, so the socket is
reclaimed, with an unclosed-socket ``ResourceWarning``, whenever a later collection runs:
inside some later test, which the suite's ``filterwarnings = error`` then fails (seen once in
CI: a connected 127.0.0.1 socket reported inside a librdkafka test, after the kafka-python
variant before it closed its clients). See docs/gateway.md, "Known client issues".

``install()`` wraps ``sock_connect`` (the await that fails or is abandoned) so the socket is
closed on any way out but success, and the TLS handshake likewise. It changes nothing else and
leaves a kafka-python without these methods alone.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

_INSTALLED = "_rcoord_tests_closes_on_failure"


def _closing_on_failure(method: Any, sock_of: Any) -> Any:
    """Wrap an ``async`` method so that whatever ends it but a return closes its socket."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except BaseException:  # a failure, a timeout, or GeneratorExit when abandoned
            sock_of(self, *args).close()
            raise

    setattr(wrapper, _INSTALLED, True)
    return wrapper


def install() -> bool:
    """Patch kafka-python in this process; return whether it was (or already is) patched."""
    try:
        # As pytest.importorskip does: kafka-python's import warns (importlib.resources).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from kafka.net.inet import KafkaNetSocket
            from kafka.net.transport import KafkaSSLTransport
    except ImportError:
        return False
    patched = False
    connect = getattr(KafkaNetSocket, "sock_connect", None)
    if connect is not None:
        if not getattr(connect, _INSTALLED, False):
            KafkaNetSocket.sock_connect = _closing_on_failure(
                connect, lambda _self, _net, sock, *_: sock)
        patched = True
    handshake = getattr(KafkaSSLTransport, "handshake", None)
    if handshake is not None and not getattr(handshake, _INSTALLED, False):
        KafkaSSLTransport.handshake = _closing_on_failure(
            handshake, lambda transport: transport._sock)
    return patched
