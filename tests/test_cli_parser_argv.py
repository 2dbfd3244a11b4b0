"""A command's own ``Parser`` checks ``sys.argv`` as it checks a list it is given."""

from __future__ import annotations

import sys

import pytest

from rcoord.cli import EXIT_USAGE, Parser

# parse_args() with no list (workers/word_count.py's main()) skipped the check for unknown
# options and left-over words: "--topc x" was hidden behind argparse's "the following arguments
# are required: --topic", and no "did you mean --topic?".


def _parser() -> Parser:
    p = Parser(prog="worker")
    p.add_argument("--topic", required=True)
    return p


@pytest.mark.parametrize(("argv", "said"), [
    (["--topc", "t"], "unrecognized option: --topc (did you mean --topic?)"),
    (["--topic", "t", "extra"], "unrecognized arguments: extra"),
])
def test_sys_argv_is_checked_as_a_list_is(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str],
                                          argv: list[str], said: str) -> None:
    errors = []
    for given in (argv, None):
        monkeypatch.setattr(sys, "argv", ["worker", *argv])
        with pytest.raises(SystemExit) as exited:
            _parser().parse_args(given)
        errors.append((exited.value.code, capsys.readouterr().err))
    assert errors[0] == errors[1] == (EXIT_USAGE, f"worker: error: {said} (see worker --help)\n")


def test_sys_argv_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["worker", "--topic", "t"])
    assert _parser().parse_args().topic == "t"
