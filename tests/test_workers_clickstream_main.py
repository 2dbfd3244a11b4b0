"""``python -m workers.clickstream``'s exit, without a JVM: Spark's session and the query are
stand-ins, so only ``main``'s own handling of a stop is under test."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pyspark_sql = pytest.importorskip("pyspark.sql", reason="pyspark is not installed")


class _Builder:
    """``SparkSession.builder``: every setter returns itself; the session does nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self

    def getOrCreate(self) -> Any:
        return SimpleNamespace(sparkContext=SimpleNamespace(setLogLevel=lambda level: None),
                               stop=lambda: None)


class _FailsWhileStopping:
    """A query whose running batch fails while ``stop_gracefully`` waits for it."""

    id = "q"

    def __init__(self) -> None:
        self.active, self.error, self.looks = True, None, 0
        self._rcoord_sink = SimpleNamespace(batches=3, records=30, late=0)

    @property
    def isActive(self) -> bool:
        return self.active

    @property
    def status(self) -> dict[str, Any]:
        self.looks += 1
        if self.looks == 3:  # the batch fails: the query terminates with its error
            self.active, self.error = False, RuntimeError("batch 3 failed: No space left")
        return {"isDataAvailable": True, "isTriggerActive": self.active, "message": ""}

    def exception(self) -> Any:
        return self.error

    def stop(self) -> None:
        self.active = False


def test_a_query_that_fails_while_it_stops_gracefully_exits_1_with_its_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    # main() read query.exception() before stop_gracefully(): a batch that failed while the
    # stop waited for it (SIGTERM, or --run-for, mid-batch) ended in status 0 and no error,
    # so a supervisor took the failure for a clean stop.
    from workers import clickstream

    monkeypatch.setattr(pyspark_sql.SparkSession, "builder", _Builder())
    monkeypatch.setattr(clickstream, "build_query", lambda spark, **kw: _FailsWhileStopping())
    monkeypatch.setenv("PYSPARK_PYTHON", "python3")
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = clickstream.main(["--group", "g", "--topic", "t", "--out", str(tmp_path),
                                   "--redis-url", "redis://127.0.0.1:1/0", "--run-for", "0"])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    err = capsys.readouterr().err
    assert status == 1
    assert "clickstream: query failed: batch 3 failed: No space left" in err


def test_the_group_timeouts_given_reach_the_source_options(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # docs/architecture.md says to set the source's rebalanceTimeoutMs above the trigger
    # interval plus the longest batch; the command had no flag for it.
    options = _main_options(monkeypatch, tmp_path, "--session-timeout-ms", "20000",
                            "--rebalance-timeout-ms", "90000")["options"]
    assert options["rebalanceTimeoutMs"] == "90000" and options["sessionTimeoutMs"] == "20000"


def _main_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str) -> Any:
    """The keywords ``main`` gives ``build_query`` for these flags."""
    from workers import clickstream

    seen: dict[str, Any] = {}

    def build_query(spark: Any, **kw: Any) -> Any:
        seen.update(kw)
        query = _FailsWhileStopping()
        query.active = False
        return query

    monkeypatch.setattr(pyspark_sql.SparkSession, "builder", _Builder())
    monkeypatch.setattr(clickstream, "build_query", build_query)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        clickstream.main(["--group", "g", "--topic", "t", "--out", str(tmp_path),
                          "--redis-url", "redis://127.0.0.1:1/0", "--run-for", "0", *flags])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return seen


@pytest.mark.parametrize(("flags", "words"), [
    (("--heartbeat-interval-ms", "5000"),  # the default session, 10000, holds two
     "--heartbeat-interval-ms: 5000 must be at most --session-timeout-ms / 3 (3333.33)"),
    (("--session-timeout-ms", "3000", "--heartbeat-interval-ms", "1001"),
     "--heartbeat-interval-ms: 1001 must be at most --session-timeout-ms / 3 (1000)"),
    (("--session-timeout-ms", "2"),
     "--session-timeout-ms: 2 is too short; it must hold three heartbeat intervals"),
    (("--session-timeout-ms", "1_0"), "argument --session-timeout-ms: '1_0'"),
    # float() took these: "nan" never stopped the query, -1 stopped it at once
    (("--run-for", "nan"), "argument --run-for: 'nan'"),
    (("--run-for", "-1"), "argument --run-for: '-1'"),
    (("--run-for", "1_0"), "argument --run-for: '1_0'"),
    (("--rebalance-timeout-ms", "2147483648"), "argument --rebalance-timeout-ms: '2147483648'"),
])
def test_group_timeouts_the_source_refuses_are_a_usage_error_before_spark_starts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        flags: tuple[str, ...], words: str) -> None:
    # Each passed the flags' type and failed in the source (OptionError) once Spark had
    # started, behind a traceback; the source's rule is now said first, naming the flags.
    with pytest.raises(SystemExit) as exited:
        _main_options(monkeypatch, tmp_path, *flags)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err


def test_group_timeouts_the_source_takes_pass(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    options = _main_options(monkeypatch, tmp_path, "--session-timeout-ms", "3000",
                            "--heartbeat-interval-ms", "1000")["options"]
    assert options == {"sessionTimeoutMs": "3000", "heartbeatIntervalMs": "1000"}
    assert _main_options(monkeypatch, tmp_path, "--session-timeout-ms", "3")["options"] == {
        "sessionTimeoutMs": "3"}


def test_a_batch_is_capped_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # There was no default maxOffsetsPerTrigger: the first batch over a large backlog read all
    # of it and collected every aggregated row (up to one per record) on the driver.
    from workers.clickstream import MAX_OFFSETS_PER_TRIGGER

    assert _main_options(monkeypatch, tmp_path)["max_offsets_per_trigger"] == \
        MAX_OFFSETS_PER_TRIGGER == 100_000
    assert _main_options(monkeypatch, tmp_path, "--max-offsets-per-trigger", "500")[
        "max_offsets_per_trigger"] == 500
    assert _main_options(monkeypatch, tmp_path, "--max-offsets-per-trigger", "-1")[
        "max_offsets_per_trigger"] is None
    for bad in ("0", "-5", "many"):
        with pytest.raises(SystemExit):
            _main_options(monkeypatch, tmp_path, "--max-offsets-per-trigger", bad)
        assert "or -1 (no limit)" in capsys.readouterr().err


class _Loaded(Exception):
    """Raised by the stand-in reader's ``load``: the options ``build_query`` gave the source."""


class _Reader:
    def __init__(self) -> None:
        self.options: dict[str, str] = {}

    def format(self, name: str) -> Any:
        return self

    def option(self, key: str, value: str) -> Any:
        self.options[key] = value
        return self

    def load(self) -> Any:
        raise _Loaded(self.options)


@pytest.mark.parametrize(("kw", "expected"), [
    ({}, "100000"),
    ({"max_offsets_per_trigger": 7}, "7"),
    ({"max_offsets_per_trigger": None}, None),
    ({"options": {"maxoffsetspertrigger": "9"}}, None),  # the caller's option, as given
])
def test_build_query_caps_the_source_by_default(kw: dict[str, Any], expected: Any) -> None:
    from workers.clickstream import build_query

    spark = SimpleNamespace(dataSource=SimpleNamespace(register=lambda source: None),
                            readStream=_Reader())
    with pytest.raises(_Loaded) as loaded:
        build_query(spark, topics="t", group="g", out="/nonexistent", **kw)
    assert loaded.value.args[0].get("maxOffsetsPerTrigger") == expected
    assert loaded.value.args[0].get("maxoffsetspertrigger") == kw.get("options", {}).get(
        "maxoffsetspertrigger")
