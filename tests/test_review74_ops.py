"""Review 74 of the operator's commands and the workers, as an operator used to Kafka's tools.
Each test fails on the code it was written against.

``workers.clickstream``'s group timeouts are checked only by the Spark source, after Spark has
started; the durations beside them are checked by argparse first (``_duration``), for the
reason its docstring gives: "a bad one used to fail after it, behind a traceback". Spark's
session and the query are stand-ins here (as in test_workers_clickstream_main), so no JVM starts.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

pyspark_sql = pytest.importorskip("pyspark.sql", reason="pyspark is not installed")


class _SparkStarted(Exception):
    """Raised by the stand-in ``SparkSession.builder``: ``main`` went on to start Spark."""


class _Builder:
    def __getattr__(self, name: str) -> Any:
        raise _SparkStarted(name)


@pytest.mark.parametrize("flag", ["--session-timeout-ms", "--heartbeat-interval-ms",
                                  "--rebalance-timeout-ms"])
@pytest.mark.parametrize("bad", ["10s", "many", "-5", "0"])
def test_a_bad_group_timeout_is_a_usage_error_before_spark_starts(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        flag: str, bad: str) -> None:
    """``--session-timeout-ms 10s`` (a unit where the flag wants ms, as ``--window 10s``
    takes one) was passed to the source as it was; the source refuses it (OptionError: a
    positive integer) only once Spark has started, after seconds, behind a traceback. As
    ``--window`` and ``--max-offsets-per-trigger``, it should exit 2 naming the flag first."""
    from workers import clickstream

    monkeypatch.setattr(pyspark_sql.SparkSession, "builder", _Builder())
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exited:
            clickstream.main(["--group", "g", "--topic", "t", "--out", str(tmp_path),
                              "--redis-url", "redis://127.0.0.1:1/0", "--run-for", "0",
                              flag, bad])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err



def test_the_namespace_comes_from_the_environment_as_the_redis_url_does(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With ``RCOORD_REDIS_URL`` and ``RCOORD_NAMESPACE`` exported (docs/operations.md: "as for
    every rcoord command"), ``python -m workers.clickstream --group G --topic T --out DIR`` took
    its Redis from the environment and its namespace not: it read group G of namespace
    ``rcoord``, while ``rcoord groups describe G`` looked in ``$RCOORD_NAMESPACE``."""
    from test_workers_clickstream_main import _main_options

    monkeypatch.setenv("RCOORD_NAMESPACE", "team-a")
    assert _main_options(monkeypatch, tmp_path)["namespace"] == "team-a"
    assert _main_options(monkeypatch, tmp_path, "--namespace", "b")["namespace"] == "b"
