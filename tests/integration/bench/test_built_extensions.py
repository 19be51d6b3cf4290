"""``bench.broker_targets.built_extensions``: a base tree exported without its C
extensions gets them compiled in place, so that its broker does not measure the
pure-Python fallbacks; a tree that has them is left as it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.broker_targets import built_extensions

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_an_exported_tree_gets_its_extensions_built(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for package in ("protocol", "segments"):
        (tree / package).mkdir(parents=True)
        for f in ROOT.glob(f"{package}/*"):
            if f.suffix in (".c", ".h") or f.name == "__init__.py":
                shutil.copy(f, tree / package / f.name)
    assert not list(tree.rglob("*.so"))
    assert built_extensions(tree) == tree
    built = sorted(p.relative_to(tree).parts[0] for p in tree.rglob("*.so"))
    assert built == ["protocol", "segments"]
    code = (
        "import segments._localio as m, protocol._fastrecords as f; print(m.__file__, f.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env={"PYTHONPATH": str(tree)},
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out.count(str(tree)) == 2
    stamps = [p.stat().st_mtime_ns for p in sorted(tree.rglob("*.so"))]
    built_extensions(tree)  # built already: nothing is compiled again
    assert [p.stat().st_mtime_ns for p in sorted(tree.rglob("*.so"))] == stamps
