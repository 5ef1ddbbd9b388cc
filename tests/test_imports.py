"""Every top-level module imports cleanly (what `pip check` cannot tell: the installed set actually works)."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p.stem for p in ROOT.glob("*.py"))


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    # A fresh interpreter per module: an import that only works because another module ran first would hide here.
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_module_docstrings():
    for name in MODULES:
        mod = importlib.import_module(name)
        assert mod.__doc__ and len(mod.__doc__.strip()) > 80, f"{name}.py needs a docstring saying what it holds"
