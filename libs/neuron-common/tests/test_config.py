from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from neuron_common.config import (
    EnvArgumentParser,
    ServiceConfig,
    config_parser,
    derived,
    flag,
    listen_address,
    non_negative_duration,
    optional_text,
    parse_config,
    positive_duration,
    switch,
)


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


# --- configs whose fields carry their flags ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Base:
    interval: float = flag("5s", "time between ticks", type=positive_duration)
    order: tuple[str, ...] = derived(())

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        v["order"] = (*v["order"], "Base")


@dataclass(frozen=True, kw_only=True)
class Example(Base, ServiceConfig):
    """An example service: its docstring is the description."""

    PROG: ClassVar[str] = "example"
    ENV_PREFIX: ClassVar[str] = "EX_"
    FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {"interval": {"default": "1s"}}

    report_name: str = flag("", "a name", type=optional_text)
    mode: bool = flag("off", "on or off", choices=("on", "off"), convert=lambda v: v == "on")
    colours: frozenset[str] = flag("red", "comma-separated", type=lambda t: frozenset(t.split(",")), name="--colour")
    verbose: bool = switch(False, "say more")

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        v["order"] = (*v["order"], "Example")
        if v["verbose"] and v["report_name"] is None:
            p.error("--verbose needs --report-name")


def test_each_field_is_its_flag_with_an_environment_twin() -> None:
    config = parse_config(Example, [], {})
    assert config == Example(
        interval=1.0, order=("Base", "Example"), report_name=None, mode=False, colours=frozenset({"red"}), verbose=False
    )
    config = parse_config(
        Example,
        ["--interval", "2s", "--report-name", "r", "--colour", "red,blue", "--verbose"],
        {"EX_MODE": "on"},
    )
    assert (config.interval, config.report_name, config.mode, config.colours, config.verbose) == (
        2.0, "r", True, frozenset({"red", "blue"}), True,
    )  # fmt: skip
    assert parse_config(Example, [], {"EX_COLOUR": "green", "EX_VERBOSE": "true", "EX_REPORT_NAME": "n"}).colours == {
        "green"
    }


def test_help_is_the_docstring_and_the_flags_as_the_service_words_them() -> None:
    text = " ".join(config_parser(Example, {}).format_help().split())
    assert text.startswith("usage: example")
    assert "An example service: its docstring is the description." in text
    assert "--interval DURATION time between ticks [env EX_INTERVAL] (default: 1s)" in text
    assert "--verbose, --no-verbose say more [env EX_VERBOSE]" in text
    assert "[env EX_COLOUR]" in text


def test_choices_are_checked_before_the_conversion_and_resolve_refuses_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_config(Example, ["--mode", "maybe"], {})
    assert "argument --mode: invalid choice: 'maybe'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(Example, ["--verbose"], {})
    assert "--verbose needs --report-name" in capsys.readouterr().err


def test_a_wording_for_a_field_without_a_flag_is_a_mistake() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Wrong(Example):
        FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {"order": {"help": "x"}}

    with pytest.raises(TypeError, match=r"Wrong\.FLAGS names fields without a flag: order"):
        config_parser(Wrong, {})


@pytest.mark.parametrize(
    "text", ["nowhere", "0.0.0.0:", "0.0.0.0:65536", "0.0.0.0:-1", "0.0.0.0:٣", "0.0.0.0:²", ":9 0"]
)
def test_a_listen_address_is_host_and_an_ascii_port(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected host:port"):
        listen_address(text)


def test_a_listen_address_without_a_host_listens_everywhere() -> None:
    assert listen_address(":9100") == ("0.0.0.0", 9100)
    assert listen_address("[::1]:0") == ("::1", 0)
