"""The clickstream pipeline's files of runs without a group (generation -1), without Spark:
a run's replay of its own batch against another run's read of the same offsets."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import test_cli_groups
from harness import wait_for_the_next_ms
from test_cli_groups import ok, run_in_process

from rcoord import Errors, MockTime, TopicPartition
from rcoord.keys import GroupKeys

pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")

from workers.clickstream import _Sink, read_counts

WINDOW_MS = 10_000


url = test_cli_groups.url  # fixture: the backend's URL

def _row(key: str, n: int) -> dict[str, Any]:
    return {"ws": 0, "k": key, "n": n}


def _files(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "counts").glob("topic=*/partition=*/*"))


@pytest.mark.parametrize("first, end, trimmed", [(100, 300, 150), (0, 3000, 2500)])
def test_a_runs_replay_of_a_batch_trimmed_meanwhile_replaces_its_own_file(
        tmp_path: Path, first: int, end: int, trimmed: int) -> None:
    # A run without a group wrote offsets first-end in one batch, and was killed before Spark
    # logged it done; retention trimmed the records before `trimmed` meanwhile, and its restart
    # on the same checkpoint replayed the batch from there. Before, the replay was refused as
    # "another such run" (its start is inside the file's range), or, where the file began over
    # a bucket of 1,024 offsets before, not seen, and written beside it: both counted.
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    if first:
        sink._write("ev", 0, 0, [_row("a", first)], -1, end=first)
    sink._write("ev", 0, first, [_row("a", end - first)], -1, end=end)
    restarted = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"))
    restarted._write("ev", 0, trimmed, [_row("a", end - trimmed)], -1, end=end)
    assert read_counts(tmp_path) == {(0, "a"): first + end - trimmed}
    assert _files(tmp_path) == [f"start-{s}.gen--1.parquet" for s in sorted({0, first})]
    restarted._write("ev", 0, end, [_row("a", 1)], -1, end=end + 1)  # and it goes on
    assert read_counts(tmp_path) == {(0, "a"): first + end - trimmed + 1}


@pytest.mark.parametrize("start, end", [(2500, 3000), (0, 50)])
def test_another_runs_read_of_a_files_offsets_is_refused_naming_the_writer(
        tmp_path: Path, start: int, end: int) -> None:
    # Offsets 2500-2999 of a 3,000-record file: before, out of the buckets looked in, written
    # beside it (counted twice). Offsets 0-49 of it: before, taken for a replay (same start)
    # and written over it, losing 50-2999.
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp1"))
    sink._write("ev", 0, 0, [_row("a", 3000)], -1, end=3000)
    other = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp2"))
    with pytest.raises(RuntimeError) as caught:
        other._write("ev", 0, start, [_row("a", end - start)], -1, end=end)
    message = str(caught.value)
    assert f"checkpoint {tmp_path / 'cp2'}" in message
    assert re.search(rf"start-0\.gen--1\.parquet \(0 to 2999\), written by a run on "
                     rf"checkpoint {re.escape(str(tmp_path / 'cp1'))}", message)
    assert "own output folder" in message
    assert read_counts(tmp_path) == {(0, "a"): 3000}
    assert _files(tmp_path) == ["start-0.gen--1.parquet"]


def test_a_write_of_the_topic_created_again_into_the_old_topics_output_is_refused(
        tmp_path: Path) -> None:
    # The old topic's generations 3-5 wrote offsets 0-349; the topic is deleted and created
    # again (its offsets start over) and the group, still there, reads it from 0 in generation
    # 6 into the same output. Before, nothing was checked: its file of 0-49 superseded the old
    # topic's files of 0-349 (read_counts 50 where 350 records of the old topic counted).
    old = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp1"))
    old._write("ev", 0, 0, [_row("a", 100)], 3, end=100, token="t1")
    old._write("ev", 0, 100, [_row("a", 250)], 5, end=350, token="t1")
    old._write("ev", 1, 0, [_row("a", 1)], 5, end=1)  # no token known: not checked
    new = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp2"))
    with pytest.raises(RuntimeError) as caught:
        new._write("ev", 0, 0, [_row("a", 50)], 6, end=50, token="t2")
    message = str(caught.value)
    assert "'ev' as created with token t1" in message and "(token t2)" in message
    assert "new output folder" in message
    with pytest.raises(RuntimeError, match="token t2"):  # any partition of the topic
        new._write("ev", 1, 0, [_row("a", 50)], 6, end=50, token="t2")
    assert read_counts(tmp_path) == {(0, "a"): 351}
    assert _files(tmp_path) == ["start-0.gen-3.parquet", "start-0.gen-5.parquet",
                                "start-100.gen-5.parquet"]
    # the same topic, in a restarted run and in another topic's folder, writes on
    again = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp3"))
    again._write("ev", 0, 350, [_row("a", 2)], 6, end=352, token="t1")
    again._write("other", 0, 0, [_row("b", 1)], 6, end=1, token="t2")
    assert read_counts(tmp_path) == {(0, "a"): 353, (0, "b"): 1}
    assert not list((tmp_path / "counts" / ".index").rglob(".tmp-*"))


def test_a_batchs_create_tokens_are_those_its_offset_log_names(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
    end = {"offsets": {"ev": {"0": 7}}, "tokens": {"ev": "t1"}, "generation": 4, "member": "m"}
    (cp / "offsets" / "0").write_text("\n".join(["v1", meta, json.dumps(end)]))
    (cp / "offsets" / "1").write_text("\n".join(["v1", meta, json.dumps({"ev": {"0": 7}})]))
    sink = _Sink(str(tmp_path), WINDOW_MS, str(cp))
    assert sink.created_tokens(0) == {"ev": "t1"}
    assert sink.created_tokens(1) == {}  # another source's offsets: none
    assert sink.created_tokens(2) == {}  # no such batch


_KILLED_IN_WRITE_TABLE = """
import os, signal, sys
import pyarrow.parquet as pq
from workers.clickstream import _Sink

real = pq.write_table
def killed(table, where, *args, **kwargs):
    real(table, where, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)  # as the driver killed inside its write
pq.write_table = killed
_Sink(sys.argv[1], 10_000, sys.argv[2])._write("ev", 0, 5, [{"ws": 0, "k": "a", "n": 3}], 6,
                                               end=8)
"""


def test_a_restarted_query_removes_at_once_the_temporary_file_its_killed_run_left(
        tmp_path: Path) -> None:
    # Before, the file of a writer killed inside write_table (a whole batch's Parquet) stayed
    # until a write over an hour later: the restart's first write found it too young.
    cp = str(tmp_path / "cp")
    killed = subprocess.run([sys.executable, "-c", _KILLED_IN_WRITE_TABLE, str(tmp_path), cp],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
                            check=False, timeout=120)
    assert killed.returncode == -9
    folder = tmp_path / "counts" / "topic=ev" / "partition=0"
    assert [p.name for p in folder.glob(".tmp-*")]  # the killed writer's
    # another query's first write may not remove it (its writer may be alive, only slow)
    _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp2"))._write(
        "ev", 0, 0, [_row("a", 5)], 6, end=5)
    assert [p.name for p in folder.glob(".tmp-*")]
    _Sink(str(tmp_path), WINDOW_MS, cp)._write("ev", 0, 5, [_row("a", 3)], 6, end=8)
    assert not list(folder.glob(".tmp-*"))
    assert read_counts(tmp_path) == {(0, "a"): 8}


def _new_checkpoint(cp: Path) -> None:
    """A checkpoint Spark starts at ``cp`` (its query id in ``metadata``, as Spark writes it)."""
    shutil.rmtree(cp, ignore_errors=True)
    cp.mkdir(parents=True)
    (cp / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))


def test_another_run_on_a_checkpoint_made_again_at_the_same_path_is_not_its_replay(
        tmp_path: Path) -> None:
    # A run without a group wrote offsets 0-2999 of partition 0. Its checkpoint is removed and
    # a new run started at the same path from offset 2500 (to read the end again). Its batch
    # overlaps the first run's file: with another path it is refused ("another run"); it was
    # taken for the first run's replay (the path alone named the run) and written over that
    # file: 0-2499 were lost.
    cp = tmp_path / "cp"
    _new_checkpoint(cp)
    _Sink(str(tmp_path), WINDOW_MS, str(cp))._write("ev", 0, 0, [_row("a", 3000)], -1,
                                                    end=3000)
    _new_checkpoint(cp)  # a new query: another id, the same path
    again = _Sink(str(tmp_path), WINDOW_MS, str(cp))
    with pytest.raises(RuntimeError, match="written by a run on checkpoint .* \\(query "):
        again._write("ev", 0, 2500, [_row("a", 500)], -1, end=3000)
    assert read_counts(tmp_path) == {(0, "a"): 3000}, "a new run's batch replaced the old file"


def test_a_live_writer_of_another_query_at_the_same_checkpoint_path_keeps_its_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two members of a group on two machines, each with its own local checkpoint at the same
    # path (one deployment's settings). Member A is between its write and its rename when
    # member B (the partition's new owner after a rebalance) first writes in that folder:
    # B's listing takes A's temporary file for its own dead run's (d7fe3c2) and removes it,
    # and A's batch fails ("was gone before its rename"). A fresh temporary file of another
    # query is kept for an hour (``_abandon``). (One file system here: A has read its query
    # id before B's checkpoint is made at the path.)
    from workers import clickstream

    cp = tmp_path / "cp"
    _new_checkpoint(cp)
    a = _Sink(str(tmp_path), WINDOW_MS, str(cp))
    a._write("ev", 0, 0, [_row("a", 5)], 7, end=5)  # (A's earlier write: folder indexed)
    _new_checkpoint(cp)  # (B's machine: its own checkpoint at that path, its own query id)
    b = _Sink(str(tmp_path), WINDOW_MS, str(cp))
    real = clickstream._mark
    b_wrote: list[bool] = []

    def b_writes_meanwhile(folder: Path, *args: Any) -> None:  # (A: written, not renamed)
        real(folder, *args)
        if not b_wrote:
            b_wrote.append(True)
            b._write("ev", 0, 10, [_row("a", 2)], 8, end=12)

    monkeypatch.setattr(clickstream, "_mark", b_writes_meanwhile)
    a._write("ev", 0, 5, [_row("a", 5)], 7, end=10)  # raised "was gone before its rename"
    monkeypatch.undo()
    assert b_wrote == [True]
    assert read_counts(tmp_path) == {(0, "a"): 12}


def _made_again(redis_client: Any, coord: Any, url: str, namespace: str, offset: int) -> None:
    """Delete group g (``rcoord groups delete``) and make it again, in a later Redis
    millisecond than it was made (its record's ``created``), by a commit of ev-0 at
    ``offset``."""
    created = redis_client.hget(GroupKeys.of(namespace, coord.config.num_partitions, "g").group,
                                "created")
    ok(run_in_process(["groups", "delete", "g", "--redis-url", url, "--namespace", namespace]))
    wait_for_the_next_ms(redis_client, int(created))
    coord.commit_offsets("g", {TopicPartition("ev", 0): offset})


def test_the_group_made_again_in_the_same_millisecond_is_told_from_the_old_one(
        tmp_path: Path, url: str, make_coordinator: Any) -> None:
    # g is deleted and made again at the same (mock) time, so both records have the same
    # 'created'. Before, the worker told the two apart by 'created' alone: the new group's
    # generation 1 wrote into the old group's output, and the old file (generation 5, begun
    # before its end) superseded it.
    coord = make_coordinator(clock=MockTime())
    coord.commit_offsets("g", {TopicPartition("ev", 0): 0})
    old = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp1"), group="g",
                namespace=coord.config.namespace, url=url)
    old._write("ev", 0, 0, [_row("a", 100)], 5, end=100)
    assert coord.delete_groups(["g"]) == {"g": Errors.NONE}
    coord.commit_offsets("g", {TopicPartition("ev", 0): 100})
    new = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp2"), group="g",
                namespace=coord.config.namespace, url=url)
    with pytest.raises(RuntimeError, match=r"its files are of group 'g' of incarnation \S+, "
                                           r"and this run is of group 'g' of incarnation"):
        new._write("ev", 0, 100, [_row("a", 50)], 1, end=150)
    assert read_counts(tmp_path) == {(0, "a"): 100}


def test_an_outputs_record_an_older_worker_made_of_the_same_group_is_taken_as_its_own(
        tmp_path: Path, url: str, make_coordinator: Any,
        redis_client: Any, namespace: str) -> None:
    # A worker older than the incarnation token recorded the group by its 'created' alone (a
    # millisecond). Upgraded, the worker asks for the token ('created' then Redis TIME's
    # microseconds) of the same group: before, it took the two for different incarnations and
    # refused its own output. Another millisecond is still another incarnation.
    coord = make_coordinator()
    coord.commit_offsets("g", {TopicPartition("ev", 0): 0})
    created = redis_client.hget(GroupKeys.of(namespace, coord.config.num_partitions, "g").group,
                                "created").decode()
    index = tmp_path / "counts" / ".index"
    index.mkdir(parents=True)
    (index / "group").write_text(json.dumps({"group": "g", "created": created}))
    sink = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp1"), group="g",
                 namespace=namespace, url=url)
    sink._write("ev", 0, 0, [_row("a", 100)], 1, end=100)
    assert read_counts(tmp_path) == {(0, "a"): 100}
    (index / "group").write_text(json.dumps({"group": "g", "created": str(int(created) - 1)}))
    with pytest.raises(RuntimeError, match=rf"of incarnation {int(created) - 1}, and this run"):
        sink._write("ev", 0, 100, [_row("a", 50)], 1, end=150)
    assert read_counts(tmp_path) == {(0, "a"): 100}


def test_a_write_of_the_group_made_again_into_the_old_groups_output_is_refused(
        tmp_path: Path, url: str, make_coordinator: Any,
        redis_client: Any, namespace: str) -> None:
    # Generations 3-5 of group g wrote offsets 0-349; g is deleted (`rcoord groups delete`)
    # and made again at offset 350, its generations starting over, and its generation 1 reads
    # 350-399 into the same output. Before, nothing was checked: that file was deleted as
    # superseded (generation 5 began before its end), read_counts 350 where 400 records had
    # counted.
    coord = make_coordinator()
    coord.commit_offsets("g", {TopicPartition("ev", 0): 0})

    def sink(cp: str, group: str = "g") -> _Sink:
        return _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / cp), group=group,
                     namespace=namespace, url=url)

    old = sink("cp1")
    old._write("ev", 0, 0, [_row("a", 100)], 3, end=100)
    old._write("ev", 0, 100, [_row("a", 250)], 5, end=350)
    _made_again(redis_client, coord, url, namespace, 350)
    new = sink("cp2")
    with pytest.raises(RuntimeError) as caught:
        new._write("ev", 0, 350, [_row("a", 50)], 1, end=400)
    message = str(caught.value)
    assert re.search(r"its files are of group 'g' of incarnation \S+, and this "
                     r"run is of group 'g' of incarnation \S+: generations start over", message)
    assert "new output folder (--out)" in message
    with pytest.raises(RuntimeError, match="of group 'g' of incarnation"):  # another topic too
        new._write("other", 0, 0, [_row("b", 1)], 1, end=1)
    # the old run, still going, rejoins the group made again: its generation going back is
    # checked again
    with pytest.raises(RuntimeError, match="of group 'g' of incarnation"):
        old._write("ev", 0, 350, [_row("a", 50)], 1, end=400)
    coord.commit_offsets("h", {TopicPartition("ev", 0): 350})
    with pytest.raises(RuntimeError, match="this run is of group 'h'"):  # another group
        sink("cp3", group="h")._write("ev", 0, 350, [_row("a", 50)], 1, end=400)
    # an output written before the group was recorded: its generations above the group's now
    (tmp_path / "counts" / ".index" / "group").unlink()
    with pytest.raises(RuntimeError, match=r"written by generation 5, and group 'g' "
                                           r"\(incarnation \S+\) is at generation 0"):
        sink("cp4")._write("ev", 0, 350, [_row("a", 50)], 1, end=400)
    assert read_counts(tmp_path) == {(0, "a"): 350}
    assert _files(tmp_path) == ["start-0.gen-3.parquet", "start-100.gen-5.parquet"]
    # into a new output, the group made again writes on
    fresh = _Sink(str(tmp_path / "new"), WINDOW_MS, str(tmp_path / "cp2"), group="g",
                  namespace=namespace, url=url)
    fresh._write("ev", 0, 350, [_row("a", 50)], 1, end=400)
    fresh._write("ev", 0, 400, [_row("a", 2)], 2, end=402)
    assert read_counts(tmp_path / "new") == {(0, "a"): 52}
    assert not list((tmp_path / "counts" / ".index").glob(".tmp-*"))

