"""The package's imports of private Dagster modules (`dagster._*`), pinned: Dagster may change
these between releases without notice, so each one stays only where Dagster has no public way,
says why in a comment above it, and a new one (or one gone) fails here, so that a Dagster
upgrade reviews exactly this list (and the tests of the modules named in it)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import eagle_assets

PACKAGE = Path(eagle_assets.__file__).resolve().parent

PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()
"""None: runs are launched and staleness read through the web UI's public GraphQL API
(defs/session.py), staleness is Dagster's own automation (defs/sensors.py)."""


@functools.cache
def private_imports(root: Path) -> dict[tuple[str, str, str], int]:
    """(file under root, module, name) -> line, for every import from a `dagster._*` module
    (and every `import dagster._*`, named by its module)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dagster._"):
                found.update({(path.relative_to(root).as_posix(), node.module, a.name): node.lineno for a in node.names})
            elif isinstance(node, ast.Import):
                found.update({(path.relative_to(root).as_posix(), a.name, a.name): node.lineno for a in node.names if a.name.startswith("dagster._")})
    return found


def test_the_private_dagster_imports_are_exactly_the_pinned_ones():
    found = set(private_imports(PACKAGE))
    assert not found - PRIVATE_IMPORTS, (
        f"new private Dagster imports: use Dagster's public API, or justify and pin them: {sorted(found - PRIVATE_IMPORTS)}"
    )
    assert not PRIVATE_IMPORTS - found, f"pinned private imports no longer made: drop them from PRIVATE_IMPORTS: {sorted(PRIVATE_IMPORTS - found)}"


def test_each_private_import_has_a_comment_above_it_saying_why():
    for (file, module, _), line in private_imports(PACKAGE).items():
        lines = (PACKAGE / file).read_text().splitlines()[: line - 1]
        block = []  # the comment and import lines directly above this import
        for text in reversed(lines):
            if not text.startswith(("#", "from dagster._", "import dagster._")):
                break
            block.append(text)
        assert any(t.startswith("# Private Dagster names") for t in block), f"{file}:{line} imports {module} with no comment above it saying why"


def test_the_scan_finds_private_imports_of_either_form(tmp_path):
    (tmp_path / "m.py").write_text("import dagster as dg\nimport dagster._utils\nfrom dagster._core.x import (A,\n  B)\nfrom dagster import asset\n")
    assert private_imports(tmp_path) == {
        ("m.py", "dagster._utils", "dagster._utils"): 2,
        ("m.py", "dagster._core.x", "A"): 3,
        ("m.py", "dagster._core.x", "B"): 3,
    }
