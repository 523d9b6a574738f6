"""Run every bench/bench_*.py and print its figures; exit 1 if any target is missed.

Figures are wall-clock on a shared 2-core machine: read them with that noise in mind.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))  # the protocol stand-ins

from common import print_figures


def main(argv: list[str]) -> int:
    wanted = set(argv)
    missed: list[str] = []
    for path in sorted(Path(__file__).parent.glob("bench_*.py")):
        if wanted and path.stem.removeprefix("bench_") not in wanted:
            continue
        module = importlib.import_module(path.stem)
        figures = module.run()
        print_figures(module.TITLE, figures)
        missed += [f"{module.TITLE}: {f.name}" for f in figures if f.met is False]
    if missed:
        print("\ntargets missed:\n  " + "\n  ".join(missed))
        return 1
    print("\nall targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
