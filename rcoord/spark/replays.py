"""Which group generation a micro-batch's records are committed under, for sinks that need it.

A ``foreachBatch`` sink that must tell a newer writer of the same records from an older one
(``workers/clickstream`` names its files by generation, so a removed member's slow batch never
overwrites its successor's) needs the generation whose fencing the batch's commit passes. For a
batch this query planned, that is the generation in the batch's planned end, which Spark writes to
the checkpoint's offset log before the batch runs. For a batch Spark *replays* after a restart,
it is not: the end was planned by the old process's member, but the replay is read and committed
by the restarted query's member, in its own, newer generation (``StreamMember.replay``). Only
the source runner knows that generation, and it runs in another process than the sink, so the
member records it in Redis (``record_replay``) before any task of the replay reads, and
``batch_generation`` looks it up.

The record is a hash per group (``rcoord.keys.replays_key``): field ``<generation>:<member>``
(the replayed end's planner; a member id names one membership, so the pair names that
membership's last batch, the only one Spark replays), value the replaying generation, and field
``@<generation>:<member>`` the time it was written, in ms of the Redis server's clock. A record
counts for ``REPLAY_TTL_S`` (a sink asks while its batch runs, minutes later at most): a read
ignores an older one, and a write drops every older one and renews the hash's expiry. The hash
alone would not do: every restart whose first batch is a replay adds a field, and a query
restarted more often than the expiry would keep them all for good. A write cannot just drop the
other fields either: members of one group replay their own batches at the same time. A field
written before the times were kept (no ``@`` field; also what an older rcoord still writes) is
read as before, and a write gives it its own time, so it is dropped one retention later.

Field ``read:<generation>:<member>`` (kept and dropped the same way) lists the partitions the
replay read again, written by every replay, also one that reads nothing, before its tasks run
(``record_replay_reads``). Spark counts a replay as a finished batch, so a query restarted
after it plans from the batch's end as from the end of a batch whose sink stored every record
(``StreamMember._resume``): that is true only of the partitions the replay read. No record
does not prove that no replay ran once ``REPLAY_TTL_S`` may have passed since the batch was
planned (``Position.planned_ms``): then ``_resume`` leaves the group's committed offsets as they
are, and the batch comes again (at least once) instead of being skipped.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import redis

from ..errors import RcoordError
from ..keys import replays_key
from ..protocol.offsets import TopicPartition
from ..topics._base import _Lua
from .clients import leased
from .options import OptionError
from .plan import Position

__all__ = ["REDIS_FAILURES", "REPLAY_TTL_S", "CheckpointUnreadableError", "batch_generation",
           "checkpoint_position", "record_replay", "record_replay_reads", "replay_reads",
           "replayed_generation"]

REPLAY_TTL_S = 7 * 24 * 3600

REDIS_FAILURES = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
                  RcoordError)
"""What recording or reading a replay raises when Redis cannot answer (a cluster client's
errors are not ``RedisError``)."""


class CheckpointUnreadableError(OSError):
    """A file of the checkpoint's offset log exists (or may) but could not be read: a
    permission, an I/O error, a network file system's hiccup. Not "the batch is not logged":
    ``batch_generation`` would answer -1 for it, and a sink naming its output by generation
    let any older writer's file win over the batch's. The ``OSError`` is its ``__cause__``."""


def _field(planned: Position) -> str:
    """The hash field naming the batch ending at ``planned``: its planner's membership."""
    return f"{planned.generation}:{planned.member or ''}"


_RECORD = _Lua("spark_replay_record")
_READ = _Lua("spark_replay_read")


def record_replay(client: Any, namespace: str, group_id: str, planned: Position,
                  generation: int, *, now_ms: int | None = None) -> None:
    """Note that the batch ending at ``planned`` is replayed in ``generation``, and drop the
    records older than ``REPLAY_TTL_S``. Raises the Redis client's error (``REDIS_FAILURES``)
    if it cannot: a replay whose generation a sink cannot learn must not run. ``now_ms``
    stands for the Redis server's clock (tests only)."""
    if planned.generation is None:
        raise ValueError("a replayed batch's end names the generation that planned it")
    if client is None:
        raise RcoordError("no Redis client to record the replay with")
    # A script on one key, not a MULTI: redis-py 5's cluster client refuses transactions.
    _RECORD(client, [replays_key(namespace, group_id)],
            [_field(planned), generation, REPLAY_TTL_S * 1000, "" if now_ms is None else now_ms])


def replayed_generation(client: Any, namespace: str, group_id: str, planned: Position, *,
                        now_ms: int | None = None) -> int | None:
    """The generation that replayed the batch ending at ``planned``; None if none did within
    ``REPLAY_TTL_S``. ``now_ms`` stands for the Redis server's clock (tests only)."""
    if planned.generation is None:
        return None
    got = _READ(client, [replays_key(namespace, group_id)],
                [_field(planned), REPLAY_TTL_S * 1000, "" if now_ms is None else now_ms])
    return None if got is None else int(got)


def _reads_field(planned: Position) -> str:
    return f"read:{_field(planned)}"


def record_replay_reads(client: Any, namespace: str, group_id: str, planned: Position,
                        read: Iterable[TopicPartition], *, now_ms: int | None = None) -> None:
    """Note that the replay of the batch ending at ``planned`` reads again ``read`` (perhaps
    none) of its partitions, and nothing else. Raises as ``record_replay`` does: a replay a
    later restart could take for a batch read in full must not run. An end planned outside
    group mode (no generation) is never resumed from, so nothing is recorded for it."""
    if planned.generation is None:
        return
    if client is None:
        raise RcoordError("no Redis client to record the replay with")
    value = json.dumps(sorted([tp.topic, tp.partition] for tp in read))
    _RECORD(client, [replays_key(namespace, group_id)],
            [_reads_field(planned), value, REPLAY_TTL_S * 1000,
             "" if now_ms is None else now_ms])


def replay_reads(client: Any, namespace: str, group_id: str, planned: Position, *,
                 now_ms: int | None = None) -> set[TopicPartition] | None:
    """The partitions the last replay of the batch ending at ``planned`` read again; None if
    no replay of it was recorded within ``REPLAY_TTL_S`` (then its planner's process ran it)."""
    if planned.generation is None:
        return None
    got = _READ(client, [replays_key(namespace, group_id)],
                [_reads_field(planned), REPLAY_TTL_S * 1000, "" if now_ms is None else now_ms])
    if got is None:
        return None
    return {TopicPartition(str(t), int(p)) for t, p in json.loads(got)}


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")
"""A location's URI scheme, as Hadoop's ``Path`` finds one: a colon before any slash, with no
``//`` needed ("hdfs:/cp" is HDFS's, on its default name node). Two characters at least: "C:"
is a Windows drive."""


def _schemeless(checkpoint: str) -> bool:
    """Whether ``checkpoint`` names no file system (a path: on Spark's default one)."""
    return _SCHEME.match(checkpoint) is None


def _local(checkpoint: str) -> Path | None:
    """The local folder of a checkpoint location: a path or a ``file:`` URI (None otherwise).
    A scheme is any, with or without ``//`` (``_SCHEME``): "hdfs:/cp", taken for a path here,
    was read on this machine without a session and found nowhere, every batch named generation
    -1, where "hdfs://nn/cp" says to pass the session."""
    if _schemeless(checkpoint):
        return Path(checkpoint)
    url = urlparse(checkpoint)
    if url.scheme != "file" or url.netloc not in ("", "localhost"):
        return None
    return Path(unquote(url.path))


def checkpoint_position(checkpoint: str, batch_id: int, *, spark: Any = None) -> Position | None:
    """The rcoord group-mode end Spark logged for ``batch_id`` in the checkpoint's offset log
    (``offsets/<batch id>``: a version line, the batch's metadata, then one end per source);
    None if the batch is not logged or no source of the query is a group-mode rcoord stream.

    A ``file:`` URI is read directly; any other location (``hdfs://``, ``s3a://`` ...) through
    ``spark``'s Hadoop file system, as Spark itself reads it. Without ``spark`` such a location
    is an ``OptionError``: answering "no generation" for a checkpoint that names one would let
    an older writer's output pass for a newer one's. A path without a scheme is where Spark's
    default file system puts it (``fs.defaultFS``: HDFS on a YARN cluster, S3 on some
    managed ones), so it is read through ``spark`` too; without ``spark`` (or with a session
    that has no JVM) it is read on this machine. Before, such a path was always read on this
    machine, found nowhere on a cluster whose default file system is another, and every batch
    was named generation -1. A log file that exists but cannot be read (a permission, an I/O
    error) raises ``CheckpointUnreadableError`` (through Hadoop, its Java exception), never
    reads as "not logged"."""
    text = _read_log(checkpoint, f"offsets/{batch_id}", spark)
    if text is None:
        return None
    for line in text.splitlines()[2:]:
        try:
            end = Position.from_json(json.loads(line))
        except ValueError:  # another source's offset (or a malformed line): not ours
            continue
        if end.generation is not None:
            return end
    return None


def batch_generation(checkpoint: str, batch_id: int, *, group: str,
                     namespace: str = "rcoord", url: str | None = None,
                     client: Any = None, first: bool = True, spark: Any = None) -> int:
    """The generation whose fencing the commit of micro-batch ``batch_id`` passes: the one that
    replayed it after a restart, else the one that planned it; -1 if the checkpoint names none
    (see ``checkpoint_position``).

    Call it from ``foreachBatch``: Spark plans the batch's reads (where a replay is recorded)
    before it calls the function (``ForeachBatchSink`` runs the plan first). Only the first
    batch a query runs after it starts can be a replay; pass ``first=False`` for the others
    and Redis is not asked. Redis is reached through ``client``, else ``url``, else
    ``RCOORD_REDIS_URL``, and only when the checkpoint names a generation. A checkpoint that is
    not on this machine is read through ``spark`` (pass the batch DataFrame's
    ``sparkSession``; see ``checkpoint_position``). A query with two group-mode rcoord sources
    is named by the first one's generation."""
    end = checkpoint_position(checkpoint, batch_id, spark=spark)
    if end is None or end.generation is None:
        return -1
    if not first:
        return end.generation
    if client is None:
        url = url or os.environ.get("RCOORD_REDIS_URL", "")
        if not url:
            raise OptionError("batch_generation: no Redis URL; pass url= or client=, or set "
                              "RCOORD_REDIS_URL")
        with leased(url) as leased_client:
            replayed = replayed_generation(leased_client, namespace, group, end)
    else:
        replayed = replayed_generation(client, namespace, group, end)
    return end.generation if replayed is None else replayed


def _read_log(checkpoint: str, name: str, spark: Any) -> str | None:
    """The text of the file ``name`` under ``checkpoint``; None if there is none. A local file
    that cannot be read is a ``CheckpointUnreadableError``: any ``OSError`` was taken for "not
    logged", so a transient read error made the batch's generation -1."""
    folder = _local(checkpoint)
    if folder is not None and (not _schemeless(checkpoint) or spark is None
                               or _jvm_of(spark) is None):
        path = folder / name
        try:
            return path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointUnreadableError(
                exc.errno, f"cannot read {str(path)!r} of checkpoint {checkpoint!r} "
                f"({exc.strerror or exc}); the batch's generation cannot be told from this: "
                "fix the checkpoint's access and run the batch again") from exc
    if spark is None:
        raise OptionError(
            f"checkpoint {checkpoint!r} is not on this machine: pass spark= (in foreachBatch, "
            "the batch DataFrame's sparkSession) to read its offset log through Hadoop's file "
            "system")
    return _read_hadoop(spark, f"{checkpoint.rstrip('/')}/{name}")


def _jvm_of(spark: Any) -> tuple[Any, Any] | None:
    """(the JVM gateway, the Java session) of ``spark``; None if it has none (a Spark Connect
    session has no ``sparkContext``)."""
    try:
        jvm, jsession = spark.sparkContext._jvm, spark._jsparkSession
    except Exception:  # noqa: BLE001 - whatever a session without a JVM raises
        return None
    return None if jvm is None or jsession is None else (jvm, jsession)


def _read_hadoop(spark: Any, location: str) -> str | None:
    """``location`` read through the Hadoop file system Spark's own checkpoint code uses (the
    session's Hadoop configuration, ``spark.hadoop.*`` included); None if it does not exist."""
    from py4j.protocol import Py4JJavaError

    got = _jvm_of(spark)
    if got is None:
        raise OptionError("the Spark session has no JVM to read the checkpoint with (a Spark "
                          "Connect session?); use a checkpoint on this machine")
    jvm, jsession = got
    path = jvm.org.apache.hadoop.fs.Path(location)
    conf = jsession.sessionState().newHadoopConf()
    try:
        stream = path.getFileSystem(conf).open(path)
    except Py4JJavaError as exc:
        if exc.java_exception.getClass().getName() == "java.io.FileNotFoundException":
            return None
        raise
    try:
        data: bytes = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return data.decode()
