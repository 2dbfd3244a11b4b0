"""The demo's ``abandon()`` (its --time-limit and Ctrl-C path) wakes the calls in flight by
shutting their sockets, and leaves closing them to the threads that use them and to
``cleanup()``, as the coordinator service's stop does (``rcoord.service.nodes.disconnect_all``)."""

from __future__ import annotations

import os
import signal
import threading
from types import SimpleNamespace

import redis
from harness import InThread, wait_until

from rcoord.demo import _Demo, _demo_client
from rcoord.testing.embedded import EmbeddedServer


def test_abandon_wakes_a_call_in_flight_and_closes_no_socket_under_it(
        own_server: EmbeddedServer) -> None:
    """A socket closed from another thread raced with a call's ``poll`` (the call could then
    watch the next socket given that descriptor for a whole socket timeout): ``abandon()``
    used ``ConnectionPool.disconnect``, which closes them."""
    client = _demo_client(own_server.url)
    pool = client.connection_pool
    held = pool.get_connection()  # in use by this test: abandon() must not close its socket
    held.connect()
    held_sock = held._sock
    assert own_server.pid is not None
    os.kill(own_server.pid, signal.SIGSTOP)
    try:
        caller = InThread(client.time)
        wait_until(lambda: any(c is not held and c._sock is not None
                               for c in pool._in_use_connections) or caller.outcome)
        _Demo.abandon(SimpleNamespace(stop_threads=threading.Event(), r=client))
        assert held_sock.fileno() != -1, "abandon() closed a socket another thread may use"
        caller.thread.join(30)
        assert not caller.thread.is_alive(), "the call in flight was not woken"
        assert isinstance(caller.outcome[0], redis.ConnectionError), caller.outcome
        try:
            client.ping()
            raise AssertionError("the abandoned client answered")
        except redis.ConnectionError as exc:
            assert "gave up" in str(exc)
    finally:
        os.kill(own_server.pid, signal.SIGCONT)
        pool.release(held)
        client.close()
    assert held_sock.fileno() == -1  # closed by close(), as cleanup() does


def test_a_worker_slow_to_start_still_joins_the_first_generation() -> None:
    """The demo's first workers joined the group as each finished importing rcoord (spawned:
    a second or more apart on a loaded machine), and a worker that came later than the 500 ms
    initial delay split the first generation (generation 5 was the first with all three).
    Now they join once all are ready: a third started late is in generation 1."""
    import subprocess
    import sys

    # The third worker starts 1 s (twice the delay) after the first two have come as far as
    # they can without it: joined the group (the demo before) or ready to (held for the rest).
    lagging = (
        "import runpy, sys, time\n"
        "from rcoord import demo\n"
        "start = demo._Demo.start_worker\n"
        "def start_late(self):\n"
        "    if len(self.names) == 2:\n"
        "        ready = getattr(self, 'ready', {})\n"
        "        while self.coord.describe_group(demo.DEMO_GROUP).state in ('Dead', 'Empty') and not (\n"
        "                ready and all(e.is_set() for e in ready.values())):\n"
        "            time.sleep(0.05)\n"
        "        time.sleep(1)\n"
        "    return start(self)\n"
        "demo._Demo.start_worker = start_late\n"
        "sys.argv = ['rcoord', 'demo', '--records', '300', '--produce-seconds', '1']\n"
        "runpy.run_module('rcoord', run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RCOORD_REDIS_URL"}
    done = subprocess.run([sys.executable, "-c", lagging], capture_output=True, check=False,
                          text=True, timeout=120, env=env)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "the group is stable: generation 1: w1 " in out, out
    assert out.rstrip().endswith("demo: OK")
