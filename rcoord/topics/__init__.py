"""Topics: the partitions a consumer group divides, as Redis Streams with Kafka offsets.

A topic with N partitions is N streams plus one metadata hash. Partition ``p`` of ``topic``:

* ``<ns>:topic:{<tag>}:<topic>:<p>``: a stream, one entry per record;
* ``<ns>:topicmeta:{<topic>}``: a hash with ``partitions``, ``created_ms`` and the retention
  settings (``retention_records``, ``retention_ms``; absent means unlimited), and the token of
  the ``create`` call that made it (``create_token``), and ``deleting`` once a ``delete`` of
  it has begun (a delete that stopped partway is finished by another, not undone by a
  ``create``);
* ``<ns>:topicmade:{<tag>}:<topic>:<p>``: that token again, beside the stream, so a resent
  ``create`` does not make the partition a second time (``add_partitions`` writes it too, and
  does not take over a stream another topic of the same name left);
* ``<ns>:topicts:{<tag>}:<topic>:<p>``: the partition's latest record timestamp and the log end
  after it (``"<ms> <end>"``): appends stamp max(clock, it), so a partition's timestamps never
  decrease, and reads take the log offsets from it (the end, and the end less ``XLEN`` for the
  start, or the first entry's offset if an ``XDEL`` by hand left one below that;
  ``topic_offsets.lua``, and so do retention, ``delete_records`` and
  ``offsets_for_times``). Delete it rather than edit it: without it they come from
  ``XINFO STREAM``, and a wrong end gives wrong log offsets.

**Offsets are stream ids.** The record at Kafka offset ``o`` has the stream id ``0-<o+1>``.
Appends use ``XADD key 0-*`` (Redis >= 7): the server itself gives the next sequence number in
millisecond 0, so the offset is assigned by the same command that stores the record, and a
script that appends several records gets consecutive offsets. ``o + 1`` because ``0-0`` is not
a valid entry id. The stream's ``last-generated-id`` survives trimming, so the log end offset
(the offset of the next record) is its sequence number even when retention removed every
record; the log start offset is the first entry's sequence minus one, or the log end when the
stream is empty. Fetching from ``o`` is ``XRANGE key 0-<o+1> +``, and waiting for records at
the log end ``e`` is ``XREAD BLOCK ... STREAMS key 0-<e>``. The ``<o+1>-0`` alternative would
need the next id computed by hand and gains nothing.

**Every script touches one partition's keys** (its stream, and for idempotent appends the
producer state beside it, under the same hash tag), so in a cluster it runs on the partition's
node. The tag of a
partition depends only on ``(topic, p)``, never on the partition count, because
``add_partitions`` must not move existing partitions. Tags follow a golden-ratio sequence
over 64 equal slot shares, rotated by the topic's hash: any prefix ``0..n-1`` of a topic's
partitions is spread over the slot range (so over the masters), and different topics start at
different places.

**One clock.** Record timestamps and retention cutoffs come from the partition node's Redis
``TIME``, read inside the script; no client clock is ever stored.

A partition stream exists from ``create``/``add_partitions`` until ``delete``; an append never
creates one (the script checks the key first), so producing to a deleted topic fails with
UNKNOWN_TOPIC_OR_PARTITION instead of resurrecting it.
"""

from ._base import (
    CorruptRecordError,
    DeletedRecords,
    FetchResult,
    Header,
    Headers,
    PartitionInfo,
    ProducerRecord,
    Record,
    RecordMetadata,
    TopicDescription,
    TopicError,
    meta_key,
    partition_key,
    partition_tag,
    producer_state_keys,
)
from .admin import DeleteRecordsIncomplete, LogStarts, Topics
from .fetch import (
    FetchWaker,
    PartitionRecords,
    fetch,
    fetch_many,
    fetch_many_as,
    log_offsets,
    resolve_offset,
)
from .producer import Producer
from .racks import node_racks, partition_racks, set_node_racks
from .times import OffsetAndTimestamp, offsets_for_times

__all__ = [
    "CorruptRecordError",
    "DeleteRecordsIncomplete",
    "DeletedRecords",
    "FetchResult",
    "FetchWaker",
    "Header",
    "Headers",
    "LogStarts",
    "OffsetAndTimestamp",
    "PartitionInfo",
    "PartitionRecords",
    "Producer",
    "ProducerRecord",
    "Record",
    "RecordMetadata",
    "TopicDescription",
    "TopicError",
    "Topics",
    "fetch",
    "fetch_many",
    "fetch_many_as",
    "log_offsets",
    "meta_key",
    "node_racks",
    "offsets_for_times",
    "partition_key",
    "partition_racks",
    "partition_tag",
    "producer_state_keys",
    "resolve_offset",
    "set_node_racks",
]
