"""Renders charts/neuron-helm-chart/README.md with helm-docs (norwoodj/helm-docs, pinned and built by
tools/build-helm-docs.sh) from README.md.gotmpl and the `# --` comments of values.yaml.

    chart_docs.py            write README.md
    chart_docs.py --check    exit 1 when README.md is not what helm-docs renders

helm-docs reports a template or values error as a warning and still exits 0, so any line it writes to
stderr fails here. Which values are documented is checked by tools/chart_schema.py (helm-docs' strict
mode would also want every child of a documented mapping, e.g. each key of `resources`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "neuron-helm-chart"
# the table in values.yaml's order, as the values are grouped there
HELM_DOCS_ARGS = ("--sort-values-order", "file", "--log-level", "warning")


class HelmDocsError(Exception):
    pass


def helm_docs_binary() -> str:
    """The pinned helm-docs, built once into the cache."""
    built = subprocess.run([str(REPO / "tools" / "build-helm-docs.sh")], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise HelmDocsError(f"tools/build-helm-docs.sh failed:\n{built.stderr}")
    return built.stdout.strip().splitlines()[-1]


def render(binary: str, chart: Path = CHART) -> str:
    """README.md as helm-docs renders it."""
    command = [binary, "--chart-search-root", str(chart), *HELM_DOCS_ARGS, "--dry-run"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 or result.stderr.strip():
        raise HelmDocsError(f"helm-docs failed:\n{result.stderr}")
    return result.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail instead of writing when README.md is stale")
    args = parser.parse_args()
    try:
        wanted = render(helm_docs_binary())
    except HelmDocsError as exc:
        print(exc, file=sys.stderr)
        return 1
    readme = CHART / "README.md"
    if args.check:
        if readme.read_text() != wanted:
            print(f"{readme} is stale: run make chart-docs", file=sys.stderr)
            return 1
        return 0
    readme.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
