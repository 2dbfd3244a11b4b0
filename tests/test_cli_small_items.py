"""Small items of the commands' option parsing: what the messages and the help say matches
what is taken, and a number is ASCII digits wherever the parser reads one."""

from __future__ import annotations

import argparse

import pytest

from rcoord.cli import _NUMBER, DECIMAL, LOG_LEVELS, Parser
from rcoord.ops.common import add_common, nonnegative_seconds, seconds


def test_the_seconds_message_names_the_exponent_it_takes() -> None:
    """``seconds`` takes ``1e3`` (cli.DECIMAL) but its message said "digits, maybe a sign and a
    fraction", so an operator told a form was wrong was not told that one is right."""
    assert seconds("1e3") == 1000.0
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        seconds("ten")
    assert "exponent" in str(refused.value) and "1e3" in str(refused.value), refused.value


def _positional_parser() -> Parser:
    p = Parser(prog="t")
    p.add_argument("name")
    return p


@pytest.mark.parametrize("text", ["-1", "-1.5", "-.5"])
def test_a_negative_number_is_a_value_not_an_option(text: str) -> None:
    assert _positional_parser().parse_args([text]).name == text


def test_the_negative_number_form_is_decimals_with_a_minus() -> None:
    for text in ("-1", "-1.", "-.5", "-1e3", "-2E-1"):
        assert _NUMBER.fullmatch(text) and DECIMAL.fullmatch(text), text
    for text in ("1", "+1", "--1", "-e3", "-1e", "-\u0663", "-1\u0663", "-\uff11"):
        assert not _NUMBER.fullmatch(text), text


def test_a_negative_number_in_another_scripts_digits_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """cli._NUMBER spelt DECIMAL's form again with ``\\d``, which matches other scripts' digits:
    "-\\u0663" (an Arabic-Indic 3) passed the parser's unknown-option check as a negative
    number, where every number rcoord reads is ASCII digits (cli.INTEGER, cli.DECIMAL)."""
    with pytest.raises(SystemExit) as exited:
        _positional_parser().parse_args(["-\u0663"])
    assert exited.value.code == 2
    assert "unrecognized option: -\u0663" in capsys.readouterr().err


def test_the_log_level_help_of_groups_and_topics_names_every_level_taken() -> None:
    """``rcoord groups ... --help`` and ``rcoord topics ... --help`` said only "DEBUG also prints
    the traceback", naming neither CRITICAL nor ERROR nor INFO, all of which are taken."""
    p = Parser(prog="t")
    add_common(p)
    (action,) = [a for a in p._actions if "--log-level" in a.option_strings]
    assert action.help is not None
    assert "CRITICAL" in LOG_LEVELS
    for level in LOG_LEVELS:
        assert level in action.help, action.help


@pytest.mark.parametrize(
    ("zero", "said"),
    [("never stop", "a number of seconds >= 0 (0: never stop)"), ("", "a number of seconds >= 0")],
)
def test_the_workers_seconds_are_one_check_with_their_own_words(zero: str, said: str) -> None:
    """word_count's --idle-exit-s and clickstream's --run-for were two copies of one check
    (``seconds``, then finite and >= 0); ``nonnegative_seconds`` is that check, with what 0
    means said where it means something."""
    parse = nonnegative_seconds(zero)
    assert parse("0") == 0.0 and parse("1.5e1") == 15.0
    for bad in ("-1", "1e400"):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            parse(bad)
        assert str(refused.value) == f"{bad!r}: {said}"
    with pytest.raises(argparse.ArgumentTypeError, match="is not a number of seconds"):
        parse("nan")


def test_the_log_level_help_of_the_coordinator_names_every_level_taken() -> None:
    """``rcoord coordinator --help`` said "DEBUG, INFO, WARNING or ERROR", though CRITICAL is
    taken too (cli.log_level checks LOG_LEVELS)."""
    from rcoord.service.cli import add_coordinator_arguments

    p = Parser(prog="t")
    add_coordinator_arguments(p)
    (action,) = [a for a in p._actions if "--log-level" in a.option_strings]
    assert action.help is not None
    for level in LOG_LEVELS:
        assert level in action.help, action.help
