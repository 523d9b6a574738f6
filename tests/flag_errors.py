"""A service refusing its flags at start, as every service's tests check it."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def refusal(parse: Callable[[], object], capsys: pytest.CaptureFixture[str]) -> str:
    """What `parse` (a service's `config.parse` with the flags under test) wrote to stderr on its
    way out: it must stop the service as argparse does, with exit status 2."""
    with pytest.raises(SystemExit) as caught:
        parse()
    assert caught.value.code == 2
    return capsys.readouterr().err
