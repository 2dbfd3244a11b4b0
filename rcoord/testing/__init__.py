"""What tests (and the demo) need beside the library: real servers on loopback and a mock clock.

* ``EmbeddedServer`` / ``EmbeddedCluster``: ``redis-server`` or ``valkey-server`` processes on
  free 127.0.0.1 ports, one node or a 3-master cluster (``rcoord.testing.embedded``);
* ``MockTime``: Kafka's MockTime, a clock the test moves (``rcoord.testing.clock``).
"""

from .clock import MockTime
from .embedded import EmbeddedCluster, EmbeddedServer

__all__ = ["EmbeddedCluster", "EmbeddedServer", "MockTime"]
