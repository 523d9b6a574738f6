"""YAML streams as the tests read and write them (rendered charts, manifests for kubectl and
kubectl-validate): through libyaml, PyYAML's C parser and emitter, with the safe constructor and
representer, so the objects are those of yaml.safe_load_all and yaml.safe_dump_all.

Why not those: the pure-Python parser took 0.2 CPU-seconds for one rendering of the chart (3,600
lines), libyaml 0.02; the chart tests parse a few hundred renderings, in the integration stage's one
process on a CPU-bound machine (tests/chart/test_chart.py: 150 s on a quiet machine, 105 s with libyaml).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import IO, Any

import yaml

# PyYAML's wheels carry libyaml; a build without it is slower, never different
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load_all(stream: str | bytes | IO[str]) -> Iterator[Any]:
    """Each document of a YAML stream, empty ones as None (as yaml.safe_load_all)."""
    return yaml.load_all(stream, Loader=_LOADER)


def dump_all(documents: Iterable[Any]) -> str:
    return yaml.dump_all(documents, Dumper=_DUMPER)
