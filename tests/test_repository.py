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
    # (uv's format: an entry's hashes continue it over lines, each ending with a backslash but the last)
    stale = re.sub(r"^orjson==(?:.*\\\n)*.*\n", "", tool.LOCK.read_text(), flags=re.M)
    stale = re.sub(r"^aiohttp==\S+", "aiohttp==0.1", stale, flags=re.M)
    assert stale.count("==") == tool.LOCK.read_text().count("==") - 1
    (tmp_path / "lock").write_text(stale)
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
    # as uv pip compile --generate-hashes writes it: every file of the version, one hash a line
    lock = f"# header\norjson==3.13.0 \\\n    --hash=sha256:{'0' * 64} \\\n    --hash=sha256:{digest}\n"
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
    # a lock entry this reader cannot take whole is an error, never a line skipped
    for broken in ["orjson>=3.13.0 --hash=sha256:" + digest, "orjson==3.13.0", "orjson==3.13.0 --hash=md5:00"]:
        with pytest.raises(ValueError, match="is not name==version --hash=sha256"):
            verify.allowed(broken)


# --- the pages a newcomer reads stay short, and their links lead somewhere (issue 54) -----------

README_MAX_LINES = 160
README_MAX_LINE_CHARS = 400
CHART_README_MAX_PROSE_LINES = 200
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+).*?\1", re.S)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$", re.M)


def linked_pages() -> list[Path]:
    """The pages whose links must resolve: the front page, the chart's README and every page under docs/."""
    return [REPO / "README.md", REPO / "charts" / "neuron-helm-chart" / "README.md", *sorted(REPO.glob("docs/*.md"))]


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: the heading's text lower-cased, every character but letters,
    digits, spaces, '-' and '_' dropped, spaces made '-'; a repeated one gets -1, -2, ..."""
    seen: dict[str, int] = {}
    anchors = set()
    for match in HEADING.finditer(FENCE.sub("", markdown)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match[2])  # a link in a heading shows its text
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(page: Path) -> list[str]:
    """Every relative link of `page` (outside code) whose file does not exist, or whose #anchor names no heading."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.\-]*:", target):  # https:, mailto: ...: not a file of this repository
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in github_anchors(linked.read_text()):
            broken.append(f"{target}: no such heading")
    return broken


def chart_readme_prose(text: str) -> list[str]:
    """The chart README's lines but the rows of the values table generated under its `## Values` heading."""
    lines = text.splitlines()
    assert "## Values" in lines, "the chart README has no '## Values' section"
    values = lines.index("## Values") + 1
    return lines[:values] + [line for line in lines[values:] if not line.startswith("|")]


def test_the_front_page_is_short() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    long = [n for n, line in enumerate(lines, 1) if len(line) > README_MAX_LINE_CHARS]
    assert not long, f"README.md lines {long} are over {README_MAX_LINE_CHARS} characters"


def test_the_chart_readme_is_short_apart_from_its_values_table() -> None:
    prose = chart_readme_prose((REPO / "charts" / "neuron-helm-chart" / "README.md").read_text())
    assert len(prose) <= CHART_README_MAX_PROSE_LINES, f"the chart README has {len(prose)} lines of prose"


def test_the_chart_readme_prose_count_leaves_out_only_the_values_table() -> None:
    text = (
        "# chart\n| a | b |\n\n## Values\n\n<!-- begin -->\n| Key | Default |\n|---|---|\n| `x` | `1` |\n<!-- end -->\n"
    )
    assert chart_readme_prose(text) == ["# chart", "| a | b |", "", "## Values", "", "<!-- begin -->", "<!-- end -->"]


@pytest.mark.parametrize("page", linked_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_heading(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# The page (`x.y`)\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#the-page-xy) [ok](other.md#same-1) [ok](#top) [ok](https://example.com/x)\n"
        "`[in code](gone.md)`\n\n# Top\n\n"
        "[gone](gone.md) [bad](other.md#not-a-heading) [code](other.md#not-a-heading-1) [self](#nowhere)\n"
    )
    assert broken_links(page) == [
        "gone.md: no such file",
        "other.md#not-a-heading: no such heading",
        "other.md#not-a-heading-1: no such heading",
        "#nowhere: no such heading",
    ]


def test_the_front_page_indexes_every_page_under_docs() -> None:
    readme = (REPO / "README.md").read_text()
    index = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| \[[^\]]+\]\((docs/[^)#]+\.md)\)", index, re.M))
    assert listed == {str(p.relative_to(REPO)) for p in REPO.glob("docs/*.md")}
