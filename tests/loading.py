"""Importing a tool of the repository (tools/*.py, services/verify_wheels.py) as a module by its path:
they are scripts, not packages. Registered in sys.modules, so dataclasses resolve their module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
