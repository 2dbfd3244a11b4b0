"""The clickstream pipeline's output files, without Spark: which file of a start offset counts
when two members wrote one (a removed member's slow batch, a zombie, and its successor's)."""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")

import pyarrow.parquet as pq

from rcoord.keys import replays_key
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.spark import OptionError, batch_generation
from rcoord.spark.plan import Position
from rcoord.spark.replays import REPLAY_TTL_S, record_replay, replayed_generation
from workers.clickstream import _settle, _Sink, read_counts

WINDOW_MS = 10_000


def _row(key: str, n: int, ws: int = 0) -> dict[str, Any]:
    return {"ws": ws, "k": key, "n": n}


def _files(out: Path) -> list[str]:
    """The partition folders' files (the index is beside them, in ``counts/.index``)."""
    return sorted(p.name for p in (out / "counts").glob("topic=*/partition=*/*"))


@pytest.mark.parametrize("zombie_last", [True, False])
def test_the_newest_generation_of_a_start_counts_whoever_writes_last(
        tmp_path: Path, zombie_last: bool) -> None:
    # Generation 5's member read offsets 5-9 of ev-0 but its batch outlived the rebalance
    # timeout; generation 6's member began at the committed offset 5 and read 5-7, then 8-9.
    # Before, the files were named by start alone and the last rename won: the zombie's
    # five-record file replaced its successor's three-record one (whose next file counts 8-9
    # again), or the other way round.
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    zombie = lambda: sink._write("ev", 0, 5, [_row("a", 5)], 5)
    if not zombie_last:
        zombie()
    sink._write("ev", 0, 5, [_row("a", 3)], 6)
    sink._write("ev", 0, 8, [_row("a", 2)], 6)
    if zombie_last:
        zombie()
    assert read_counts(tmp_path) == {(0, "a"): 5}
    assert _files(tmp_path) == ["start-5.gen-6.parquet", "start-8.gen-6.parquet"]


def test_two_writers_renaming_before_either_settles_leave_the_newest(tmp_path: Path) -> None:
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 5, [_row("a", 3)], 6)
    folder = tmp_path / "counts" / "topic=ev" / "partition=0"
    # Both renamed, neither settled yet (generation 6's file is out of the zombie's sight while
    # it writes, so its own settling keeps its file): the reader already counts generation 6's.
    (folder / "start-5.gen-6.parquet").rename(folder / "keep")
    sink._write("ev", 0, 5, [_row("a", 5)], 5)
    (folder / "keep").rename(folder / "start-5.gen-6.parquet")
    assert read_counts(tmp_path) == {(0, "a"): 3}
    _settle(folder, 5)  # the later of the two to settle sees both and deletes generation 5's
    assert _files(tmp_path) == ["start-5.gen-6.parquet"]


def test_a_retry_of_a_batch_replaces_its_first_attempt(tmp_path: Path) -> None:
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 1, 0, [_row("a", 2), _row("b", 1, ws=WINDOW_MS)], 3)
    sink._write("ev", 1, 0, [_row("a", 2), _row("b", 1, ws=WINDOW_MS)], 3)
    assert read_counts(tmp_path) == {(0, "a"): 2, (WINDOW_MS, "b"): 1}
    assert _files(tmp_path) == ["start-0.gen-3.parquet"]


def _offset_log(cp: Path, batch_id: int, *ends: Any) -> None:
    """Spark's offset log entry of a batch: a version, the batch's metadata, one end per source."""
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
    (cp / "offsets" / str(batch_id)).write_text(
        "\n".join(["v1", meta, *(json.dumps(e) for e in ends)]))


def test_the_generation_is_the_planned_one_unless_a_restarted_query_replayed_the_batch(
        tmp_path: Path, redis_server: Any, single_client: Any, namespace: str) -> None:
    cp = tmp_path / "cp"
    end = {"offsets": {"ev": {"0": 7}}, "generation": 4, "member": "spark-1"}
    _offset_log(cp, 2, {"ev": {"0": 7}}, end)  # another source first, then the rcoord stream
    _offset_log(cp, 3, {"ev": {"0": 7}})
    sink = _Sink(str(tmp_path), WINDOW_MS, str(cp), group="g", namespace=namespace,
                 url=redis_server.url)
    assert sink.generation(2) == 4  # planned in 4, never replayed
    assert sink.generation(3) == -1  # another source's offsets: no generation
    assert sink.generation(9) == -1  # no such batch
    # A restarted query's member replays batch 2 in generation 6: its file must beat the file
    # a generation-5 member wrote at the same start and never committed.
    record_replay(single_client, namespace, "g", Position.from_json(end), 6)
    assert sink.generation(2) == 6
    assert 0 < single_client.ttl(replays_key(namespace, "g")) <= REPLAY_TTL_S
    # only a run's first batch can be a replay: a later one takes the planned generation
    # without asking Redis
    sink.batches = 1
    assert sink.generation(2) == 4
    sink.batches = 0
    # the record names the planner: another member's batch of generation 4 was not replayed
    _offset_log(cp, 5, {**end, "member": "spark-2"})
    assert sink.generation(5) == 4
    # a file: URI names the same checkpoint; another file system's is read through Spark
    # (tests/test_spark.py), and without a session it is an error, not "no generation"
    uri = _Sink(str(tmp_path), WINDOW_MS, cp.as_uri(), group="g", namespace=namespace,
                url=redis_server.url)
    assert uri.generation(2) == 6
    with pytest.raises(OptionError, match="not on this machine: pass spark="):
        batch_generation("hdfs://nn/cp", 2, group="g", client=single_client)
    # a session without a JVM (Spark Connect's has no sparkContext) cannot read it either
    with pytest.raises(OptionError, match="no JVM"):
        batch_generation("hdfs://nn/cp", 2, group="g", client=single_client, spark=object())


def test_a_replay_record_reads_back_on_one_node_and_on_a_cluster(
        redis_client: Any, namespace: str) -> None:
    planned = Position({TP("ev", 0): 3}, generation=2, member="m-1")
    assert replayed_generation(redis_client, namespace, "g", planned) is None
    record_replay(redis_client, namespace, "g", planned, 5)
    record_replay(redis_client, namespace, "g", planned, 7)  # replayed again, later
    assert replayed_generation(redis_client, namespace, "g", planned) == 7
    assert replayed_generation(redis_client, namespace, "other", planned) is None


def test_a_sink_without_a_redis_url_says_what_to_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RCOORD_REDIS_URL", raising=False)
    _offset_log(tmp_path / "cp", 0, {"offsets": {"ev": {"0": 1}}, "generation": 1,
                                     "member": "m"})
    with pytest.raises(OptionError, match="RCOORD_REDIS_URL"):
        batch_generation(str(tmp_path / "cp"), 0, group="g")


def test_a_checkpoint_path_without_a_scheme_is_read_on_sparks_default_file_system(
        tmp_path: Path, single_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # checkpointLocation="/checkpoints/clicks" on a cluster whose fs.defaultFS is HDFS (YARN)
    # or S3: Spark writes the offset log there, not on the driver's disk. Before, a path
    # without a scheme was always read on this machine, found nowhere, and every batch was
    # named generation -1 (a zombie's file could replace its successor's).
    from rcoord.spark import replays

    end = {"offsets": {"ev": {"0": 7}}, "generation": 4, "member": "spark-1"}
    remote = tmp_path / "remote"  # stands for the default file system
    _offset_log(remote / "checkpoints" / "clicks", 2, end)
    asked: list[str] = []

    def hadoop(spark: Any, location: str) -> str | None:
        asked.append(location)
        try:
            return (remote / location.lstrip("/")).read_text()
        except OSError:
            return None

    monkeypatch.setattr(replays, "_read_hadoop", hadoop)
    session = SimpleNamespace(sparkContext=SimpleNamespace(_jvm=object()),
                              _jsparkSession=object())
    ask = functools.partial(batch_generation, group="g", client=single_client, first=False)
    assert ask("/checkpoints/clicks", 2, spark=session) == 4
    assert asked == ["/checkpoints/clicks/offsets/2"]
    # a file: URI names this machine whatever the default file system; and without a session
    # (or with one that has no JVM: Spark Connect) a path is read here, as before
    local = tmp_path / "local"
    _offset_log(local, 2, {**end, "generation": 9})
    assert ask(local.as_uri(), 2, spark=session) == 9
    assert ask(str(local), 2) == 9
    assert ask(str(local), 2, spark=SimpleNamespace()) == 9
    assert asked == ["/checkpoints/clicks/offsets/2"]


def test_a_checkpoint_uri_without_an_authority_is_not_taken_for_a_path(
        single_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # "hdfs:/checkpoints/clicks" (HDFS on its default name node: Hadoop's Path takes a scheme
    # without "//") was taken for a path on this machine: without a session it was found
    # nowhere and every batch was generation -1, where "hdfs://nn/..." says to pass spark=.
    from rcoord.spark import replays

    with pytest.raises(OptionError, match="not on this machine: pass spark="):
        batch_generation("hdfs:/checkpoints/clicks", 2, group="g", client=single_client)
    with pytest.raises(OptionError, match="no JVM"):
        batch_generation("hdfs:/checkpoints/clicks", 2, group="g", client=single_client,
                         spark=object())
    asked: list[str] = []
    monkeypatch.setattr(replays, "_read_hadoop",
                        lambda spark, location: asked.append(location))
    session = SimpleNamespace(sparkContext=SimpleNamespace(_jvm=object()),
                              _jsparkSession=object())
    assert replays.checkpoint_position("hdfs:/checkpoints/clicks", 2, spark=session) is None
    assert replays.checkpoint_position("s3a:/b/cp", 2, spark=session) is None
    assert asked == ["hdfs:/checkpoints/clicks/offsets/2", "s3a:/b/cp/offsets/2"]
    # a Windows drive is a path, not a scheme
    assert replays._local("C:/checkpoints/clicks") is not None


def test_window_starts_come_back_exact_to_the_millisecond(tmp_path: Path) -> None:
    """Window starts were written and read back through float seconds (a datetime's
    ``timestamp()``): some came back 1 ms off, about 1 in 170 of the times after 2038
    (2180095214614 among them), so their counts were summed under another window."""
    starts = [2_180_095_214_614, 4_102_444_800_001, 1_700_000_000_123, 0]
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 5, [_row(f"k{i}", i + 1, ws) for i, ws in enumerate(starts)], 1)
    assert read_counts(tmp_path) == {(ws, f"k{i}"): i + 1 for i, ws in enumerate(starts)}


def test_a_write_does_not_list_the_partition_folder_it_writes_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every write globbed its whole partition folder (in _settle), which gains a file per
    # micro-batch for ever: 1.6 ms a write at 1,000 files, 192 ms at 100,000, quadratic over a
    # query's life. Now only a run's first write in a folder lists it (to index older files).
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    folder = tmp_path / "counts" / "topic=ev" / "partition=0"
    for start in range(0, 30, 3):
        sink._write("ev", 0, start, [_row("a", 3)], 1)
    listed: list[Path] = []
    for name in ("scandir", "listdir"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda p=".", real=real: listed.append(Path(p)) or real(p))
    sink._write("ev", 0, 30, [_row("a", 2)], 1)
    sink._write("ev", 0, 30, [_row("a", 1)], 2)  # a newer generation supersedes it
    assert folder not in listed and listed, listed
    monkeypatch.undo()
    assert read_counts(tmp_path) == {(0, "a"): 31}
    assert len(_files(tmp_path)) == 11


def test_a_file_written_before_the_index_is_superseded_by_a_replay(tmp_path: Path) -> None:
    # a start an earlier version wrote (no index entry) is written again by a newer generation
    # (a replay after a crash): the sink's first write in the folder indexes the old file
    _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))._write(
        "ev", 0, 5, [_row("a", 5)], 5)
    shutil.rmtree(tmp_path / "counts" / ".index", ignore_errors=True)
    _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))._write(
        "ev", 0, 5, [_row("a", 3)], 6)
    assert read_counts(tmp_path) == {(0, "a"): 3}
    assert _files(tmp_path) == ["start-5.gen-6.parquet"]


def test_a_zombie_killed_between_its_rename_and_its_settling_leaves_no_second_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Generation 6's member wrote start 5 and settled; then generation 5's zombie renamed its
    # own file of start 5 and was SIGKILLed before settling. Nobody writes start 5 again, so
    # both files stayed for good: read_counts took the newest, but a plain read of the output
    # (spark.read.parquet, pyarrow) counted offsets 5-7 twice. The next write in the folder
    # settles it.
    from workers import clickstream

    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 5, [_row("a", 3)], 6)

    def killed(folder: Path, start: int, end: int | None = None) -> None:
        raise SystemExit("SIGKILL")

    monkeypatch.setattr(clickstream, "_settle", killed)
    with pytest.raises(SystemExit):
        sink._write("ev", 0, 5, [_row("a", 5)], 5)
    monkeypatch.undo()
    sink._write("ev", 0, 8, [_row("a", 2)], 6)
    assert _files(tmp_path) == ["start-5.gen-6.parquet", "start-8.gen-6.parquet"]
    assert sum(pq.read_table(tmp_path / "counts")["count"].to_pylist()) == 5
    assert read_counts(tmp_path) == {(0, "a"): 5}
    index = tmp_path / "counts" / ".index" / "topic=ev" / "partition=0"
    assert not list((index / "unsettled").iterdir())


def test_a_write_not_yet_renamed_stays_listed_for_the_next_writes(tmp_path: Path) -> None:
    # a writer between writing its temporary file and renaming it (alive and slow, or killed):
    # another write settles its start but keeps its entry, since the rename may still come
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 5, [_row("a", 3)], 6)
    folder = tmp_path / "counts" / "topic=ev" / "partition=0"
    (folder / ".tmp-slow").write_bytes(b"")
    index = tmp_path / "counts" / ".index" / "topic=ev" / "partition=0"
    (index / "gens" / "0" / "5.5").touch()
    (index / "unsettled" / "5.5.slow").touch()
    sink._write("ev", 0, 8, [_row("a", 2)], 6)
    assert [p.name for p in (index / "unsettled").iterdir()] == ["5.5.slow"]
    os.replace(folder / ".tmp-slow", folder / "start-5.gen-5.parquet")  # renamed, then killed
    sink._write("ev", 0, 10, [_row("a", 1)], 6)
    assert _files(tmp_path) == ["start-10.gen-6.parquet", "start-5.gen-6.parquet",
                                "start-8.gen-6.parquet"]
    assert not list((index / "unsettled").iterdir())


def test_starts_that_share_an_index_bucket_settle_apart(tmp_path: Path) -> None:
    # starts 5 and 50 share the index's bucket (and a leading digit); generation -1 (a source
    # without a group) is superseded by any group generation; generation 2, which began at 50
    # (generation 1's batch from 50 was not committed), supersedes none of generation 1's
    # files before it
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 5, [_row("a", 4)], -1)
    sink._write("ev", 0, 5, [_row("a", 2)], 1)
    sink._write("ev", 0, 50, [_row("a", 1)], 1)
    sink._write("ev", 0, 50, [_row("b", 1)], 2)
    assert _files(tmp_path) == ["start-5.gen-1.parquet", "start-50.gen-2.parquet"]
    assert read_counts(tmp_path) == {(0, "a"): 2, (0, "b"): 1}


def test_a_runs_first_write_reads_the_index_by_bucket_not_one_file_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A run's first write in a folder indexes the files older than the index (_index). It
    # looked up each file's entry (a stat per file of the folder's history: 1.7 s at 100,000
    # files, on every restart, in the first batch, per partition); it lists the index's
    # buckets instead, so a restart's stats do not grow with the folder.
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    for start in range(0, 3 * 60, 3):
        sink._write("ev", 0, start, [_row("a", 3)], 1)
    stats: list[Any] = []
    real = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: stats.append(p) or real(p, *a, **k))
    _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))._write(
        "ev", 0, 180, [_row("a", 2)], 1)
    monkeypatch.undo()
    assert len(stats) < 30, stats
    assert read_counts(tmp_path) == {(0, "a"): 182}


@pytest.mark.parametrize("fails", ["write_table", "index"])
def test_a_write_that_fails_before_its_rename_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str) -> None:
    # A full disk in pq.write_table (or in the index, after it) left the half-written
    # ".tmp-<attempt>" in the partition folder for good, one per failed attempt.
    import errno

    from workers import clickstream

    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 0, [_row("a", 2)], 1)

    def full(*args: Any, **kw: Any) -> None:
        if fails == "write_table":
            Path(args[1]).write_bytes(b"PAR1")  # a part was written before the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    if fails == "write_table":
        monkeypatch.setattr(pq, "write_table", full)
    else:
        monkeypatch.setattr(clickstream, "_mark", full)
    with pytest.raises(OSError, match="No space"):
        sink._write("ev", 0, 2, [_row("a", 3)], 1)
    monkeypatch.undo()
    folder = tmp_path / "counts" / "topic=ev" / "partition=0"
    assert sorted(p.name for p in folder.iterdir()) == ["start-0.gen-1.parquet"]
    index = tmp_path / "counts" / ".index" / "topic=ev" / "partition=0"
    assert not list((index / "unsettled").iterdir())
    sink._write("ev", 0, 2, [_row("a", 3)], 1)  # the retry
    assert read_counts(tmp_path) == {(0, "a"): 5}


def test_a_writer_killed_before_its_rename_is_cleaned_up_once_stale(tmp_path: Path) -> None:
    # A writer killed after writing its temporary file (and its unsettled entry) but before
    # renaming it left both for good: a whole batch's Parquet in ".tmp-<attempt>", and an entry
    # every later write of the partition settled again. A killed write_table (no entry yet)
    # left its file for good too. Once older than _STALE_S, the next write (or, for a file
    # without an entry, a run's first write in the folder) removes them.
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 5, [_row("a", 3)], 6)
    folder = tmp_path / "counts" / "topic=ev" / "partition=0"
    index = tmp_path / "counts" / ".index" / "topic=ev" / "partition=0"
    for attempt in ("dead", "young"):
        (folder / f".tmp-{attempt}").write_bytes(b"PAR1")
        (index / "unsettled" / f"5.5.{attempt}").touch()
    (folder / ".tmp-nameless").write_bytes(b"PAR1")  # killed inside write_table
    for name in (".tmp-dead", ".tmp-nameless"):
        os.utime(folder / name, (0, 0))  # written long ago
    sink._write("ev", 0, 8, [_row("a", 2)], 6)
    assert sorted(p.name for p in (index / "unsettled").iterdir()) == ["5.5.young"]
    assert not (folder / ".tmp-dead").exists() and (folder / ".tmp-young").exists()
    assert (folder / ".tmp-nameless").exists()  # no entry: found by a run's first write only
    _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))._write("ev", 0, 10, [_row("a", 1)], 6)
    assert sorted(p.name for p in folder.iterdir()) == [
        ".tmp-young", "start-10.gen-6.parquet", "start-5.gen-6.parquet",
        "start-8.gen-6.parquet"]
    assert read_counts(tmp_path) == {(0, "a"): 6}


def test_a_writer_whose_temporary_file_was_taken_for_a_dead_ones_fails_its_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # paused between writing and renaming for longer than _STALE_S: another write removed its
    # file, and its rename, which nobody would settle, must not happen
    from workers import clickstream

    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 5, [_row("a", 3)], 6)
    folder = tmp_path / "counts" / "topic=ev" / "partition=0"
    real = clickstream._mark

    def paused(folder: Path, *args: Any) -> None:
        real(folder, *args)
        for tmp in folder.glob(".tmp-*"):
            tmp.unlink()

    monkeypatch.setattr(clickstream, "_mark", paused)
    with pytest.raises(RuntimeError, match="was gone before its rename"):
        sink._write("ev", 0, 5, [_row("a", 5)], 5)
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == ["start-5.gen-6.parquet"]
    index = tmp_path / "counts" / ".index" / "topic=ev" / "partition=0"
    assert not list((index / "unsettled").iterdir())


def test_a_batch_is_named_by_where_its_plan_begins_each_partition(tmp_path: Path) -> None:
    # batch 0 of a run says where every partition begins (starts); batch 1 goes on from it;
    # batch 2 is of a new generation, so its partitions begin at its starts again
    cp = tmp_path / "cp"
    first = {"offsets": {"ev": {"0": 10, "1": 4}}, "starts": {"ev": {"0": 5, "1": 0}},
             "generation": 6, "member": "m"}
    _offset_log(cp, 0, first)
    _offset_log(cp, 1, {"offsets": {"ev": {"0": 12, "1": 4}}, "generation": 6, "member": "m"})
    _offset_log(cp, 2, {"offsets": {"ev": {"0": 20}}, "starts": {"ev": {"0": 11}},
                        "generation": 7, "member": "m"})
    _offset_log(cp, 4, {"ev": {"0": 3}})  # another source's offsets
    sink = _Sink(str(tmp_path), WINDOW_MS, str(cp))
    assert sink.planned_starts(0) == {("ev", 0): 5, ("ev", 1): 0}
    assert sink.planned_starts(1) == {("ev", 0): 10, ("ev", 1): 4}
    assert sink.planned_starts(2) == {("ev", 0): 11}
    assert sink.planned_starts(3) == {}  # not logged
    assert sink.planned_starts(4) == {}


# -- superseding by offset range: a newer generation's file supersedes every older generation's
# file that ends past where the newer generation began the partition (not only the file of the
# same start)


def _settle_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes without their settling (a writer killed after its rename): only read_counts's
    rule stands between the files and a count twice."""
    from workers import clickstream

    monkeypatch.setattr(clickstream, "_settle", lambda *a, **k: None)
    monkeypatch.setattr(clickstream, "_settle_unsettled", lambda *a, **k: None)


@pytest.mark.parametrize("settled", [True, False])
@pytest.mark.parametrize("zombie_last", [True, False])
def test_a_zombies_uncommitted_batches_are_all_superseded_by_its_successors_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zombie_last: bool,
        settled: bool) -> None:
    # Generation 5's commit of offset 5 failed (ConnectionLost: "will retry") and it went on
    # planning in its generation: offsets 2-4, then 5-9, neither committed. Generation 6 began
    # at the committed offset 2 and read 2-9 in one batch. Before, only the zombie's file of
    # start 2 was superseded, and offsets 5-9 counted twice (13 where 8 is right).
    if not settled:
        _settle_off(monkeypatch)
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 2, [_row("a", 3)], 5, end=5)
    if zombie_last:
        sink._write("ev", 0, 2, [_row("a", 8)], 6, end=10)
    sink._write("ev", 0, 5, [_row("a", 5)], 5, end=10)
    if not zombie_last:
        sink._write("ev", 0, 2, [_row("a", 8)], 6, end=10)
    assert read_counts(tmp_path) == {(0, "a"): 8}
    if settled:
        assert _files(tmp_path) == ["start-2.gen-6.parquet"]


@pytest.mark.parametrize("settled", [True, False])
@pytest.mark.parametrize("zombie_last", [True, False])
def test_a_zombies_batch_is_superseded_by_a_successor_that_began_past_a_trim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zombie_last: bool,
        settled: bool) -> None:
    # The zombie of generation 5 read offsets 5-9 and never committed; retention trimmed the
    # log to 7 before generation 6 planned, so it began at 7 (failOnDataLoss=false) and read
    # 7-9. Before, the two files had different starts and 7-9 counted twice (8 where 3 is).
    if not settled:
        _settle_off(monkeypatch)
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    if not zombie_last:
        sink._write("ev", 0, 5, [_row("a", 5)], 5, end=10)
    sink._write("ev", 0, 7, [_row("a", 3)], 6, end=10)
    if zombie_last:
        sink._write("ev", 0, 5, [_row("a", 5)], 5, end=10)
    assert read_counts(tmp_path) == {(0, "a"): 3}
    if settled:
        assert _files(tmp_path) == ["start-7.gen-6.parquet"]


def test_committed_batches_of_every_generation_count(tmp_path: Path) -> None:
    # one generation, many batches; then generation 6 from generation 5's committed offset 40;
    # then generation 7 past a trim (offsets 50-51 deleted before it planned, after generation
    # 6 committed 50): no file of a committed batch is superseded
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    for start in range(0, 40, 2):
        sink._write("ev", 0, start, [_row("a", 2)], 5, end=start + 2)
    sink._write("ev", 0, 40, [_row("a", 10)], 6, end=50)
    sink._write("ev", 0, 52, [_row("a", 3)], 7, end=55)
    sink._write("ev", 0, 55, [_row("a", 1)], 7, end=56)
    assert read_counts(tmp_path) == {(0, "a"): 54}
    assert len(_files(tmp_path)) == 23


@pytest.mark.parametrize("restart", [False, True])
def test_a_zombies_file_further_on_is_left_out_then_deleted(tmp_path: Path, restart: bool) -> None:
    # A write settles only the index buckets around its own range (its cost must not grow
    # with the folder): the zombie's file of offsets 5000-5006 stays on disk until a write of
    # generation 6 there (or a run's first write in the folder), and read_counts leaves it
    # out meanwhile.
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 0, [_row("a", 2)], 5, end=2)  # committed
    sink._write("ev", 0, 2, [_row("a", 10)], 5, end=5000)  # the zombie's, never committed
    sink._write("ev", 0, 5000, [_row("a", 7)], 5, end=5007)
    sink._write("ev", 0, 2, [_row("a", 9)], 6, end=4000)
    assert read_counts(tmp_path) == {(0, "a"): 11}
    assert "start-5000.gen-5.parquet" in _files(tmp_path)
    if restart:
        _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))._write(
            "ev", 0, 9000, [_row("b", 1)], 7, end=9001)
        assert read_counts(tmp_path) == {(0, "a"): 11, (0, "b"): 1}
    else:
        sink._write("ev", 0, 4000, [_row("a", 8)], 6, end=5007)
        assert read_counts(tmp_path) == {(0, "a"): 19}
    assert "start-5000.gen-5.parquet" not in _files(tmp_path)
    assert "start-0.gen-5.parquet" in _files(tmp_path)


def test_read_counts_while_a_write_supersedes_a_file_it_listed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # read_counts lists the files that count, then reads them; a replay of a newer generation
    # that settles in between deletes one it listed. It failed with FileNotFoundError (a
    # dashboard reading the output of a running pipeline); it reads the folder again.
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 5, [_row("a", 5)], 5, end=10)
    real = pq.read_table
    replays = [lambda: sink._write("ev", 0, 5, [_row("a", 3)], 6, end=8)]

    def read_table(path: Any, *args: Any, **kw: Any) -> Any:
        while replays:
            replays.pop()()
        return real(path, *args, **kw)

    monkeypatch.setattr(pq, "read_table", read_table)
    assert read_counts(tmp_path) == {(0, "a"): 3}


def test_a_long_batch_a_trim_cut_is_left_out_then_deleted_by_a_runs_first_write(
        tmp_path: Path) -> None:
    # The zombie's batch of offsets 0-2999 began two index buckets before the trim its
    # successor began after (2500): the successor's writes never look there, so a run's first
    # write in the folder deletes it; read_counts leaves it out before that.
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 0, [_row("a", 7)], 5, end=3000)
    sink._write("ev", 0, 2500, [_row("a", 2)], 6, end=3000)
    assert read_counts(tmp_path) == {(0, "a"): 2}
    assert "start-0.gen-5.parquet" in _files(tmp_path)
    _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))._write(
        "ev", 0, 3000, [_row("a", 1)], 6, end=3001)
    assert _files(tmp_path) == ["start-2500.gen-6.parquet", "start-3000.gen-6.parquet"]
    assert read_counts(tmp_path) == {(0, "a"): 3}


def _plain_read(out: Path) -> dict[tuple[int, str], int]:
    """What ``spark.read.parquet(OUT + "/counts")`` summed per (window, key) reads: every file
    (pyarrow's dataset skips the hidden index, as Spark does)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    table = ds.dataset(out / "counts", format="parquet", partitioning="hive").to_table()
    totals: dict[tuple[int, str], int] = {}
    starts = table["window_start"].cast(pa.int64()).to_pylist()
    for start, key, count in zip(starts, table["key"].to_pylist(), table["count"].to_pylist(),
                                 strict=True):
        totals[(start, key)] = totals.get((start, key), 0) + count
    return totals


def test_settle_makes_a_plain_read_count_a_long_batch_a_trim_cut_once(tmp_path: Path) -> None:
    # As above, and the successor's instance is still the one running (or stopped): the
    # zombie's file of offsets 0-2999 stays, and a plain read of the stopped pipeline's output
    # counted offsets 2500-2999 twice (9 where 2 is right), with nothing to make it right
    # short of starting an instance again. settle() does a run's first write's settling.
    from workers.clickstream import settle

    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    sink._write("ev", 0, 0, [_row("a", 7)], 5, end=3000)
    sink._write("ev", 0, 2500, [_row("a", 2)], 6, end=3000)
    sink._write("ev", 1, 0, [_row("b", 4)], 6, end=4)
    assert _plain_read(tmp_path) == {(0, "a"): 9, (0, "b"): 4}
    settle(tmp_path)
    assert _plain_read(tmp_path) == read_counts(tmp_path) == {(0, "a"): 2, (0, "b"): 4}
    assert "start-0.gen-5.parquet" not in _files(tmp_path)
    settle(tmp_path / "nothing-written-yet")  # no counts folder: nothing to do


@pytest.mark.parametrize("first_end", [100, 200])
def test_a_second_run_without_a_group_that_reads_the_same_records_again_is_refused(
        tmp_path: Path, first_end: int) -> None:
    # A run without a group (build_query(source=...)) writes generation -1, which nothing
    # supersedes. A second such run on another checkpoint read offsets 0-199 again in other
    # batches: its file of 0-149 replaced the first run's of 0 (same name), and the first run's
    # of 100-199 stayed beside the second's of 150-199: read_counts summed 300 where 200 were.
    first = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp1"))
    first._write("ev", 0, 0, [_row("a", first_end)], -1, end=first_end)
    if first_end == 100:
        first._write("ev", 0, 100, [_row("a", 100)], -1, end=200)
    first._write("ev", 0, 200, [_row("a", 1)], -1, end=201)
    first._write("ev", 0, 0, [_row("a", first_end)], -1, end=first_end)  # its restart's replay
    second = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp2"))
    with pytest.raises(RuntimeError, match="own output folder"):
        second._write("ev", 0, 150 if first_end == 200 else 50, [_row("a", 50)], -1, end=200)
    assert read_counts(tmp_path) == {(0, "a"): 201}
    assert not [p for p in (tmp_path / "counts").rglob(".tmp-*")]
    # a run without a group that goes on where the first stopped (a source from the latest
    # offsets) writes on
    second._write("ev", 0, 201, [_row("a", 3)], -1, end=204)
    assert read_counts(tmp_path) == {(0, "a"): 204}
