"""docs/remediation.md says what the controller does: its permissions table is rbac's, its IAM policy
(and docs/security.md's) is the Auto Scaling backend's, and it names every flag the controller takes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from neuron_remediation import config, rbac
from neuron_remediation.replacement import IAM_POLICY

PAGE = Path(__file__).resolve().parents[3] / "docs" / "remediation.md"


def test_the_permissions_table_is_rbacs() -> None:
    text = PAGE.read_text()
    match = re.search(r"<!-- rbac:begin [^>]*-->\n(.*?)<!-- rbac:end -->", text, re.DOTALL)
    assert match, "the rbac markers"
    assert match.group(1).strip() == rbac.markdown_table()


def test_every_flag_is_on_the_page() -> None:
    text = PAGE.read_text()
    flags = [a.option_strings[0] for a in config.parser({})._actions if a.option_strings[0] != "-h"]
    assert len(flags) > 20
    assert [f for f in flags if f"`{f}`" not in text] == []


def test_every_event_reason_is_on_the_page() -> None:
    text = PAGE.read_text()
    source = (Path(config.__file__).parent / "planner.py").read_text() + (
        Path(config.__file__).parent / "app.py"
    ).read_text()
    reasons = set(re.findall(r'"((?:Remediation|Reboot|Replacement)[A-Za-z]+)"', source))
    assert len(reasons) >= 10
    assert sorted(r for r in reasons if f"`{r}`" not in text) == []


def test_the_iam_policy_on_the_pages_is_the_backends() -> None:
    security = PAGE.with_name("security.md")
    for page in (PAGE, security):
        blocks = re.findall(
            r"<!-- iam:begin [^>]*-->\n```json\n(.*?)```\n<!-- iam:end -->", page.read_text(), re.DOTALL
        )
        assert len(blocks) == 1, page.name
        assert json.loads(blocks[0]) == IAM_POLICY, page.name
