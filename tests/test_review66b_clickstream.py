"""Review 66b: the clickstream sink's check of the group its output is of (``_check_group``).

After a run's first write, it asks Redis again only where a generation comes below the highest
the run wrote. A group made again (deleted, or removed by offset retention) starts its
generations over at 1, and the old run, still going, rejoins it: once the new incarnation's
generation has climbed back to the run's highest (an equal one), nothing is checked, and a file
of the new incarnation overlaps one of the old at the same generation, which neither supersedes
(records counted twice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import test_cli_groups
from test_workers_review65 import WINDOW_MS, _made_again, _row

from rcoord import TopicPartition

pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")

from workers.clickstream import _Sink, read_counts

url = test_cli_groups.url  # fixture: the backend's URL

def test_a_write_of_the_group_made_again_at_the_runs_highest_generation_is_refused(
        tmp_path: Path, url: str, make_coordinator: Any,
        redis_client: Any, namespace: str) -> None:
    coord = make_coordinator()
    coord.commit_offsets("g", {TopicPartition("ev", 0): 0})
    run = _Sink(str(tmp_path), WINDOW_MS, str(tmp_path / "cp"), group="g",
                namespace=namespace, url=url)
    run._write("ev", 0, 0, [_row("a", 100)], 2, end=100)
    run._write("ev", 0, 100, [_row("a", 100)], 3, end=200)  # the run's highest: 3
    _made_again(redis_client, coord, url, namespace, 150)  # its offset at 150
    # The run rejoins the group made again, whose generation has come to 3 again (its 3rd
    # rebalance), and writes 150-249 at generation 3: a write of another incarnation of the
    # group into the output, which the sink promises to refuse (_check_group's docstring).
    try:
        run._write("ev", 0, 150, [_row("a", 100)], 3, end=250)
    except RuntimeError:
        return
    pytest.fail("accepted: the output now counts " + repr(read_counts(tmp_path))
                + " for 250 distinct offsets (150-199 of both incarnations at generation 3)")
