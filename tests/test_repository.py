"""Promises the repository makes about itself: CI runs the README's quick start, pins are pins."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest
from loading import load

REPO = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines() if line.strip()]


def test_ci_runs_exactly_the_quick_start_minus_the_demo() -> None:
    ci = (REPO / ".ci/run").read_text()
    assert "set -euo pipefail" in ci
    ci_commands = [line.strip() for line in ci.splitlines() if line.strip().startswith("make ")]
    readme = quick_start_commands()
    assert ci_commands == [c for c in readme if c != "make demo"]
    assert "make demo" in readme


def test_every_quick_start_target_exists() -> None:
    makefile = (REPO / "Makefile").read_text()
    for command in quick_start_commands():
        target = command.split()[1]
        assert re.search(rf"^{target}:", makefile, re.M), f"README promises `{command}`"


def test_python_dependencies_are_pinned() -> None:
    lines = [line for line in (REPO / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert lines
    # an exact version may carry a PEP 440 epoch (grafana-foundation-sdk's builds are `<epoch>!<grafana version>`)
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==(\d+!)?[\w.\-+]+", line) for line in lines), lines


@pytest.mark.integration
def test_no_package_registry_host_is_written_down() -> None:
    # Spelled in pieces so that this file does not name them either.
    hosts = [
        ".".join(parts)
        for parts in (
            ("pypi", "org"),
            ("pythonhosted", "org"),
            ("proxy", "golang", "org"),
            ("registry", "npmjs", "org"),
            ("deb", "debian", "org"),
        )
    ]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in listed:
        path = REPO / name
        if not path.is_file() or path.stat().st_size > 1_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for host in hosts:
            assert host not in text, f"{path} names {host}"


def test_setup_installs_every_package_libs_first() -> None:
    setup = (REPO / "tools/setup.sh").read_text()
    listed = re.search(r"^packages=\((.*)\)$", setup, re.M)
    assert listed is not None
    libs = listed.group(1).split()
    assert sorted(libs) == sorted(str(p.parent.relative_to(REPO)) for p in REPO.glob("libs/*/pyproject.toml"))
    assert "for svc in services/*/" in setup


# --- the images' third-party wheels, pinned by hash (issue 24 item 5) ---------------------------


def test_the_image_lock_covers_every_distribution_the_images_need_at_its_pinned_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = load("image_wheels", REPO / "tools" / "image_wheels.py")
    assert tool.check() == []
    # the check fails on a stale lock: a needed distribution missing, another at a version not pinned
    stale = [line for line in tool.LOCK.read_text().splitlines() if not line.startswith("orjson==")]
    stale = [re.sub(r"^aiohttp==[^ ]+", "aiohttp==0.1", line) for line in stale]
    (tmp_path / "lock").write_text("\n".join(stale))
    monkeypatch.setattr(tool, "LOCK", tmp_path / "lock")
    assert tool.check() == [
        "aiohttp: the lock has 0.1, constraints.txt pins 3.14.5",
        "orjson is needed by the images but not in the lock",
    ]


def test_a_wheel_outside_the_lock_or_with_another_digest_is_refused(tmp_path: Path) -> None:
    verify = load("verify_wheels", REPO / "services" / "verify_wheels.py")
    good = tmp_path / "orjson-3.13.0-cp311-cp311-manylinux_2_17_x86_64.whl"
    good.write_bytes(b"the reviewed bytes")
    digest = hashlib.sha256(b"the reviewed bytes").hexdigest()
    lock = f"# header\norjson==3.13.0 --hash=sha256:{digest}\n"
    assert verify.refusals(lock, [good]) == []
    tampered = tmp_path / "other" / good.name
    tampered.parent.mkdir()
    tampered.write_bytes(b"something else")
    stranger = tmp_path / "evil-1.0-py3-none-any.whl"
    stranger.write_bytes(b"x")
    older = tmp_path / "orjson-3.12.0-cp311-cp311-manylinux_2_17_x86_64.whl"
    older.write_bytes(b"the reviewed bytes")
    assert verify.refusals(lock, [tampered, stranger, older]) == [
        "evil-1.0-py3-none-any.whl: evil 1.0 is not in the lock",
        f"{older.name}: orjson 3.12.0 is not in the lock",
        f"{good.name}: its sha256 is not the one the lock lists",
    ]
