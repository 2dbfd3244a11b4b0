"""A checkpoint's offset log that cannot be read is an error, not "the batch is not logged"."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from rcoord.spark import batch_generation
from rcoord.spark.replays import CheckpointUnreadableError, checkpoint_position


def _offset_log(cp: Path, batch_id: int, end: Any) -> Path:
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
    path = cp / "offsets" / str(batch_id)
    path.write_text("\n".join(["v1", meta, json.dumps(end)]))
    return path


def test_an_offset_log_that_cannot_be_read_is_an_error_not_generation_minus_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, any OSError (EIO on an NFS hiccup, EACCES) read as "not logged": the batch was
    # named generation -1, and a sink naming its output by generation (workers/clickstream)
    # let an older generation's file win over it, dropping the batch's counts silently.
    cp = tmp_path / "cp"
    logged = _offset_log(cp, 2, {"offsets": {"ev": {"0": 7}}, "generation": 4,
                                 "member": "spark-1"})
    assert batch_generation(str(cp), 2, group="g", first=False) == 4
    assert batch_generation(str(cp), 3, group="g", first=False) == -1  # not logged
    real = Path.read_text

    def flaky(self: Path, *args: Any, **kwargs: Any) -> str:
        if self == logged:
            raise OSError(errno.EIO, "Input/output error")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", flaky)
    with pytest.raises(CheckpointUnreadableError, match="cannot read .*offsets/2") as got:
        batch_generation(str(cp), 2, group="g", first=False)
    assert got.value.errno == errno.EIO
    assert isinstance(got.value.__cause__, OSError)
    with pytest.raises(CheckpointUnreadableError):
        checkpoint_position(cp.as_uri(), 2)
    # a missing batch (or checkpoint) still reads as not logged
    assert checkpoint_position(str(cp), 3) is None
    assert checkpoint_position(str(tmp_path / "nowhere"), 2) is None


def test_a_folder_where_the_log_file_should_be_is_an_error(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    (cp / "offsets" / "2").mkdir(parents=True)
    with pytest.raises(CheckpointUnreadableError):
        checkpoint_position(str(cp), 2)
