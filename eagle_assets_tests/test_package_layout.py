"""The package holds the product and nothing else: every module is reached from an entry point,
no two modules import each other (directly or round a longer circle, imports inside functions
counted), the formatter runs over every line (no line opts out), and `eagle-assets` is the one
command line (besides the few that `COMMAND_LINES` names and why)."""

from __future__ import annotations

import ast
from pathlib import Path

from eagle_assets.defs.code_versions import PACKAGE, module_closure
from eagle_assets.paths import PROJECT_ROOT

ENTRY_POINTS = [
    "cli.py",  # eagle-assets
    "definitions.py",  # the code location (workspace.yaml)
    "drafter/train.py",  # the trainer under torchrun
    "defs/session.py",  # a session's supervisor process
    # Run by the engine's interpreter, by path or from the engine's PYTHONPATH.
    *(str(p.relative_to(PACKAGE)) for p in sorted((PACKAGE / "engines").glob("vllm_*.py"))),
    *(str(p.relative_to(PACKAGE)) for p in sorted((PACKAGE / "engines" / "engine_site").glob("*.py"))),
]


COMMAND_LINES = {
    "cli.py": "eagle-assets itself (typer)",
    "drafter/train.py": "the trainer's torchrun entry",
    "defs/session.py": "a session's supervisor process, started by the package itself",
    "engines/vllm_preflight.py": "run by the engine's interpreter, which has no typer",
    "engines/vllm_reasoning.py": "run by the engine's interpreter, which has no typer",
}
"""The package modules that may have a `__main__` block or parse arguments (engines/engine_site/ too, run by the engine)."""


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, anywhere in its body."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("eagle_assets"):
                graph[name] |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
                graph[name] |= {node.module} & modules.keys()
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names} & modules.keys()
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_is_reached_from_an_entry_point():
    reached = module_closure(PACKAGE, ENTRY_POINTS)
    loose = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert [m for m in loose if m not in reached] == []  # move benchmark-only code under benchmarks/


def test_no_two_modules_import_each_other():
    assert circles(import_graph()) == []


def test_the_circle_finder_sees_a_circle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


MARKERS = ("skip", "off")  # spelt apart, so that this file does not carry them


def test_the_formatter_runs_over_every_line():
    skips = [
        f"{path.relative_to(PROJECT_ROOT)}:{n}"
        for folder in ("eagle_assets", "eagle_assets_tests", "benchmarks")
        for path in sorted((PROJECT_ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if any(f"fmt: {word}" in line for word in MARKERS)
    ]
    assert skips == []


def _is_main_block(node: ast.AST) -> bool:
    """`if __name__ == "__main__":`, either way round."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.comparators) == 1):
        return False
    sides = {ast.unparse(node.test.left), ast.unparse(node.test.comparators[0])}
    return sides == {"__name__", "'__main__'"}


def command_lines(package: Path) -> list[str]:
    """Modules outside COMMAND_LINES and engines/engine_site/ with a `__main__` block or an argparse import."""
    found = []
    for path in sorted(package.rglob("*.py")):
        name = str(path.relative_to(package))
        if name in COMMAND_LINES or name.startswith("engines/engine_site/"):
            continue
        tree = ast.parse(path.read_text())
        imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imports |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        if "argparse" in imports or any(_is_main_block(n) for n in ast.walk(tree)):
            found.append(name)
    return found


def test_eagle_assets_is_the_one_command_line(tmp_path):
    assert command_lines(PACKAGE) == []  # a command belongs in cli.py (or a cli_*.py group it registers)
    # The finder sees each way of writing one.
    (tmp_path / "engines" / "engine_site").mkdir(parents=True)
    (tmp_path / "a.py").write_text("import argparse\n")
    (tmp_path / "b.py").write_text("if '__main__' == __name__:\n    pass\n")
    (tmp_path / "c.py").write_text("def f():\n    from argparse import ArgumentParser\n")
    (tmp_path / "cli.py").write_text('if __name__ == "__main__":\n    pass\n')
    (tmp_path / "engines" / "engine_site" / "d.py").write_text("import argparse\n")
    assert command_lines(tmp_path) == ["a.py", "b.py", "c.py"]
