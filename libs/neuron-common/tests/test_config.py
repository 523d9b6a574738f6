from __future__ import annotations

import argparse

import pytest

from neuron_common.config import EnvArgumentParser, non_negative_duration, positive_duration


def test_positive_duration_takes_go_durations_and_bare_seconds() -> None:
    assert positive_duration("500ms") == 0.5
    assert positive_duration("1h30m") == 5400.0
    assert positive_duration("2.5") == 2.5
    for text, message in (("0s", "must be greater than 0"), ("-1s", "must be greater than 0"), ("abc", "got 'abc'")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            positive_duration(text)


def test_non_negative_duration_takes_zero() -> None:
    assert non_negative_duration("0") == 0.0
    assert non_negative_duration("0s") == 0.0
    assert non_negative_duration("5m") == 300.0
    with pytest.raises(argparse.ArgumentTypeError, match="must not be negative, got '-1s'"):
        non_negative_duration("-1s")


def parser(env: dict[str, str]) -> EnvArgumentParser:
    p = EnvArgumentParser(prog="svc", env_prefix="SVC_", env=env)
    p.add_flag("--interval", default="5s", type=positive_duration, help="time between ticks")
    return p


def test_a_duration_flag_from_its_default_flag_and_variable() -> None:
    assert parser({}).parse_args([]).interval == 5.0  # a string default goes through the type
    assert parser({}).parse_args(["--interval", "500ms"]).interval == 0.5
    assert parser({"SVC_INTERVAL": "500ms"}).parse_args([]).interval == 0.5
    assert parser({"SVC_INTERVAL": "500ms"}).parse_args(["--interval", "2s"]).interval == 2.0


def test_help_names_durations_and_shows_defaults_as_written() -> None:
    text = " ".join(parser({}).format_help().split())
    assert "--interval DURATION" in text
    assert "(default: 5s)" in text
    assert "a bare number is seconds" in text


def test_a_bad_duration_names_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser({"SVC_INTERVAL": "soon"})
    assert (
        "environment variable SVC_INTERVAL='soon' is invalid for --interval: "
        "expected a duration like 500ms, 2s or 5m, got 'soon'"
    ) in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser({}).parse_args(["--interval", "abc"])
    assert "--interval: expected a duration like 500ms, 2s or 5m, got 'abc'" in capsys.readouterr().err
