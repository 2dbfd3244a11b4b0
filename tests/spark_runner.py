"""Spark's stream-source runner driven without a JVM: ``FakeJvm`` plays the JVM's side.

The child process runs pyspark's own ``python_streaming_source_runner.main`` (the process that
hosts a query's stream reader and its group membership) on a socket, and ``FakeJvm`` speaks
the protocol of ``PythonStreamingSourceRunner`` (Spark 4.3): the start-up handshake, function
calls by id, and ``stop()``'s way of ending the process (``stop_like_spark``: SIGTERM, close the
socket, SIGTERM again). So the way a real query's runner ends can be repeated exactly, in
milliseconds and without timing luck.

Run as ``python -m spark_runner FD``: FD is the child's end of a socket pair.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import CaseInsensitiveDict, DataSourceStreamReader

from rcoord.spark.source import RcoordDataSource, StreamReader

ROOT = Path(__file__).resolve().parent.parent
INITIAL_OFFSET_FUNC_ID = 884  # python_streaming_source_runner's function ids
PYTHON_EXCEPTION_THROWN = -2  # pyspark.serializers.SpecialLengths


def _kafka_schema_json() -> str:
    """The reader's schema as Spark sends it to the runner: the Kafka source's (``SCHEMA_DDL``),
    which the reader checks (before, a one-column stand-in was sent)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", ArrayType(header))]).json()


SCHEMA_JSON = _kafka_schema_json()


class LateSigtermSource(RcoordDataSource):
    """The rcoord source whose reader gets Spark's second SIGTERM as its ``stop()`` begins.

    That is where the measured second SIGTERM usually lands (see ``rcoord.spark.shutdown``);
    raising it here makes that interleaving certain instead of likely.
    """

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        reader = super().streamReader(schema)
        assert isinstance(reader, StreamReader)
        return _LateSigtermReader(reader.opts)


class _LateSigtermReader(StreamReader):
    def stop(self) -> None:
        signal.raise_signal(signal.SIGTERM)
        super().stop()


class FakeJvm:
    """The JVM side of one stream-source runner (``PythonStreamingSourceRunner``)."""

    def __init__(self, source: type[RcoordDataSource], options: dict[str, str],
                 log_path: Path) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spark_runner", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, cwd=ROOT, stdout=self._log,
            stderr=subprocess.STDOUT)
        theirs.close()
        self._sock: socket.socket | None = ours
        self._file = ours.makefile("rwb")
        # init(): python version, spark files (a root and no includes), the pickled data
        # source, the output schema, the Arrow batch size; then the runner answers 0.
        self._utf(f"{sys.version_info[0]}.{sys.version_info[1]}")
        self._utf(str(log_path.parent))
        self._int(0)
        import pickle

        command = pickle.dumps(source(CaseInsensitiveDict(options)))
        self._int(len(command))
        self._file.write(command)
        self._utf(SCHEMA_JSON)
        self._int(10_000)
        self._file.flush()
        status = self._read_int()
        if status != 0:
            raise RuntimeError(f"the runner failed to start: {self._error(status)}")

    def initial_offset(self) -> str:
        self._int(INITIAL_OFFSET_FUNC_ID)
        self._file.flush()
        n = self._read_int()
        if n == PYTHON_EXCEPTION_THROWN:
            raise RuntimeError(f"initialOffset failed: {self._error(n)}")
        return self._file.read(n).decode()

    def stop_like_spark(self) -> None:
        """``PythonStreamingSourceRunner.stop()``: ``stopWorker`` (SIGTERM, then the socket is
        closed), then ``PythonWorkerFactory.stop()`` (SIGTERM again). No SIGKILL, no wait."""
        self.proc.send_signal(signal.SIGTERM)
        self.close_socket()
        self.proc.send_signal(signal.SIGTERM)

    def close_socket(self) -> None:
        """What the runner sees when the JVM goes away: end of file on its socket."""
        if self._sock is not None:
            self._file.close()
            self._sock.close()
            self._sock = None

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        self.close_socket()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._log.close()

    # -- framing (big-endian ints, length-prefixed UTF-8), as pyspark.serializers reads it

    def _int(self, n: int) -> None:
        self._file.write(struct.pack("!i", n))

    def _utf(self, text: str) -> None:
        data = text.encode()
        self._int(len(data))
        self._file.write(data)

    def _read_int(self) -> int:
        data = self._file.read(4)
        if len(data) < 4:
            raise EOFError("the runner closed its socket")
        return int(struct.unpack("!i", data)[0])

    def _error(self, status: int) -> str:
        if status != PYTHON_EXCEPTION_THROWN:
            return f"status {status}"
        n = self._read_int()
        return self._file.read(n).decode(errors="replace")


def _child(fd: int) -> None:
    from pyspark.sql.streaming.python_streaming_source_runner import main

    sock = socket.socket(fileno=fd)
    # As pyspark.worker_util.get_sock_file_to_executor does: one buffered file both ways.
    with sock.makefile("rwb", 65536) as sock_file:
        main(sock_file, sock_file)


if __name__ == "__main__":
    _child(int(sys.argv[1]))
