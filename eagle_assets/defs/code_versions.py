"""Code versions that move only when what an asset computes moves.

Each asset has an explicit version (`VERSIONS`) and a Dagster code version made of it and the
defaults of its settings (`code_version`): a docstring, a comment, a benchmark-only module or a
package upgrade never makes an asset stale. What keeps the explicit versions honest is a lock
(`code_versions.lock.json`, checked in): per asset, a hash of the code its computation runs,
normalised (the AST without docstrings; comments are not in it), split by module. The test
`eagle_assets_tests/defs/test_code_versions.py` fails when that code changed and the lock was
not renewed; then the developer decides:

* what the asset computes changed: raise its number in `VERSIONS` (Dagster then marks it
  stale, and what is built from it follows once it has new content);
* it did not (a refactor, a rename, a faster path to the same numbers): leave the number;

and either way renews the lock, saying which in the commit message:

    make relock        # = .venv/bin/eagle-assets dev relock

The code an asset runs: the asset's function in its module and the names of that module it
uses (its Config, its helpers), then every eagle_assets module those import, transitively, and
the modules it starts in other processes (`ENTRIES`). Python's own `import` statements are read
from the source, not executed, so a module only benchmarks import is in no asset's code.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from eagle_assets.durable import write_durably

PACKAGE = Path(__file__).resolve().parent.parent
"""The eagle_assets package folder."""
LOCK_FILE = Path(__file__).resolve().with_name("code_versions.lock.json")
RELOCK_COMMAND = "make relock  (or: .venv/bin/eagle-assets dev relock)"

VERSIONS: dict[str, int] = {
    "prompts": 1,
    "synthetic_corpus": 2,
    "vocab_mapping": 1,
    "hidden_state_shards": 3,
    "benchmark_reference": 1,
    "drafter_checkpoint": 3,
    "benchmark_report": 3,
}
"""Each asset's version: raise it when what the asset computes changes (module doc)."""

_ENGINE_SITE = (
    "engines/engine_site/eagle_assets_vllm_fixes.py",
    "engines/engine_site/eagle_assets_hidden_states.py",
    "engines/engine_site/eagle_assets_tokenizer_compat.py",
)
"""Loaded by the vLLM servers an asset starts (its answers, its states), never imported here."""


@dataclass(frozen=True)
class Entry:
    """Where an asset's computation starts: its function in a defs module, and the modules it
    runs in other processes (torchrun's trainer, the engine's plugins)."""

    module: str
    """The module defining the asset, relative to the package (e.g. "defs/corpus.py")."""
    function: str
    """The asset's function in it (the asset's key)."""
    elsewhere: tuple[str, ...] = ()
    """Modules the asset starts in another process, relative to the package."""


ENTRIES: dict[str, Entry] = {
    "prompts": Entry("defs/corpus.py", "prompts", _ENGINE_SITE),
    "synthetic_corpus": Entry("defs/corpus.py", "synthetic_corpus", _ENGINE_SITE),
    "vocab_mapping": Entry("defs/hidden_states.py", "vocab_mapping"),
    "hidden_state_shards": Entry("defs/hidden_states.py", "hidden_state_shards", _ENGINE_SITE),
    "benchmark_reference": Entry("defs/benchmark.py", "benchmark_reference", _ENGINE_SITE),
    "drafter_checkpoint": Entry("defs/drafter.py", "drafter_checkpoint", ("drafter/train.py",)),
    "benchmark_report": Entry("defs/benchmark.py", "benchmark_report", _ENGINE_SITE),
}


# -- normalised code ------------------------------------------------------------------------


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    """`tree` without bare string statements (docstrings, attribute docstrings): they compute nothing."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))]
            node.body = kept or [ast.Pass()]
    return tree


def normalised(nodes: Iterable[ast.AST]) -> str:
    """A hash of AST nodes without docstrings, positions or comments."""
    h = hashlib.sha256()
    for node in nodes:
        h.update(ast.dump(_strip_docstrings(node), annotate_fields=True, include_attributes=False).encode())
    return h.hexdigest()[:16]


def _parse(root: Path, module: str) -> ast.Module:
    return ast.parse((root / module).read_text(), filename=module)


def _module_file(root: Path, dotted: str) -> str | None:
    """The file (relative to the package) of an eagle_assets module, or None for any other."""
    parts = dotted.split(".")
    if parts[0] != "eagle_assets":
        return None
    rel = Path(*parts[1:]) if len(parts) > 1 else Path()
    if (root / rel).with_suffix(".py").is_file() and len(parts) > 1:
        return rel.with_suffix(".py").as_posix()
    if (root / rel / "__init__.py").is_file():
        return (rel / "__init__.py").as_posix()
    return None


def _imported(root: Path, node: ast.AST, here: str) -> dict[str, str]:
    """{name bound here: module file} for one import statement, eagle_assets modules only."""
    out = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            file = _module_file(root, alias.name)
            if file:
                out[alias.asname or alias.name.split(".")[0]] = file
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: resolved from this module's package
            package = ["eagle_assets", *Path(here).parent.parts]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        for alias in node.names:
            # `from eagle_assets.corpus import checks` names a module; `from ... import name` its module.
            file = _module_file(root, f"{base}.{alias.name}") or _module_file(root, base)
            if file:
                out[alias.asname or alias.name] = file
    return out


def module_closure(root: Path, modules: Iterable[str]) -> set[str]:
    """Every eagle_assets module `modules` import, transitively (imports inside functions too).
    Package `__init__.py` files count only where imported by name: the project's hold no
    computation (defs/__init__.py is the Definitions' wiring)."""
    todo, seen = [m for m in modules if (root / m).is_file()], set()
    while todo:
        module = todo.pop()
        if module in seen or not (root / module).is_file():
            continue
        seen.add(module)
        for node in ast.walk(_parse(root, module)):
            todo.extend(_imported(root, node, module).values())
    return seen


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def asset_code(root: Path, entry: Entry) -> tuple[str, set[str]]:
    """(hash of the asset's own code, the modules it imports): the asset's function without its
    decorator (names, descriptions), and the top-level statements of its module it uses, transitively."""
    tree = _parse(root, entry.module)
    defined: dict[str, ast.stmt] = {}
    imports: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined[stmt.name] = stmt
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for name in _names(target):
                    defined[name] = stmt
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            imports.update(_imported(root, stmt, entry.module))
    if entry.function not in defined:
        raise ValueError(f"{entry.module} defines no {entry.function}: fix ENTRIES in {Path(__file__).name}")
    asset = defined[entry.function]
    body = ast.FunctionDef(**{**{f: getattr(asset, f) for f in asset._fields}, "decorator_list": []})
    used, modules, todo = [body], set(), [body]
    seen = {entry.function}
    while todo:
        node = todo.pop()
        for name in sorted(_names(node)):
            if name in imports:
                modules.add(imports[name])
            elif name in defined and name not in seen:
                seen.add(name)
                used.append(defined[name])
                todo.append(defined[name])
        for inner in ast.walk(node):  # imports inside the function
            if isinstance(inner, (ast.Import, ast.ImportFrom)):
                modules.update(_imported(root, inner, entry.module).values())
    return normalised(used), modules


def fingerprints(root: Path = PACKAGE, entries: dict[str, Entry] | None = None) -> dict[str, dict]:
    """Per asset: {"version", "code" (its own code's hash), "modules" ({module: hash})}."""
    cache: dict[str, str] = {}

    def module_hash(module: str) -> str:
        if module not in cache:
            cache[module] = normalised([_parse(root, module)])
        return cache[module]

    out = {}
    for asset, entry in (entries or ENTRIES).items():
        code, imported = asset_code(root, entry)
        modules = module_closure(root, [*imported, *entry.elsewhere]) - {entry.module}
        missing = [m for m in entry.elsewhere if not (root / m).is_file()]
        if missing:
            raise ValueError(f"{asset}: ENTRIES names {', '.join(missing)}, which is not in {root}")
        out[asset] = {"version": VERSIONS[asset], "code": code, "modules": {m: module_hash(m) for m in sorted(modules)}}
    return out


# -- the lock -------------------------------------------------------------------------------


def read_lock(path: Path = LOCK_FILE) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def write_lock(root: Path = PACKAGE, path: Path = LOCK_FILE) -> dict:
    """Renew the lock from the code under `root`, atomically."""
    lock = {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "assets": fingerprints(root)}
    write_durably(path, (json.dumps(lock, indent=1, sort_keys=True) + "\n").encode())
    return lock


def lock_problems(root: Path = PACKAGE, lock: dict | None = None) -> list[str]:
    """What differs between the code under `root` and the lock, one line per asset; [] when none."""
    lock = read_lock() if lock is None else lock
    locked = lock.get("assets", {})
    problems = []
    for asset, now in fingerprints(root).items():
        before = locked.get(asset)
        if before is None:
            problems.append(f"{asset}: not in the lock")
            continue
        changed = sorted(m for m in set(now["modules"]) | set(before["modules"]) if now["modules"].get(m) != before["modules"].get(m))
        if now["code"] != before["code"]:
            changed.insert(0, f"{ENTRIES[asset].module} ({asset} itself or what it uses there)")
        if now["version"] != before["version"]:
            problems.append(f"{asset}: version {before['version']} -> {now['version']}, lock not renewed")
        elif changed:
            problems.append(f"{asset} (version {now['version']}): code changed in {', '.join(changed)}")
    for asset in sorted(set(locked) - set(ENTRIES)):
        problems.append(f"{asset}: in the lock but no longer an asset")
    return problems


def problems_message(problems: list[str]) -> str:
    return (
        f"The code of these assets differs from {LOCK_FILE.relative_to(PACKAGE.parent)}:\n  "
        + "\n  ".join(problems)
        + f"\nFor each asset whose output changes with this code, raise its number in VERSIONS "
        f"(eagle_assets/defs/code_versions.py): Dagster then marks it stale. Leave the number where the "
        f"output stays the same (a refactor, a rename). Either way run\n  {RELOCK_COMMAND}\n"
        "and commit the lock, saying in the message which assets you bumped, or that none compute anything new."
    )


# -- Dagster code versions ------------------------------------------------------------------


def _default_text(value) -> str:
    # A path inside the package (a shipped parent drafter) reads the same in every checkout.
    return repr(value).replace(str(PACKAGE), "<eagle_assets>")


REPORTING_SETTINGS = frozenset({"tracker", "tracker_project", "tracker_uri", "push_to_hub", "push_private"})
"""Settings that say where an asset reports or publishes what it computed (a tracker, the hub),
never what it computes: left out of its code version, so choosing them makes nothing stale."""


def code_version(asset: str, config: type | None = None) -> str:
    """The asset's Dagster code version: its explicit version and a hash of its settings'
    defaults (the code location's preset and run file among them, defs/settings.py), so a new
    default makes the asset stale as a new version does (`REPORTING_SETTINGS` aside)."""
    if asset not in VERSIONS:
        raise KeyError(f"no version for asset {asset!r}: add it to VERSIONS and ENTRIES in {Path(__file__).name}")
    if config is None:
        return f"v{VERSIONS[asset]}"
    defaults = {name: _default_text(field.default) for name, field in config.model_fields.items() if name not in REPORTING_SETTINGS}
    digest = hashlib.sha256(json.dumps(defaults, sort_keys=True).encode()).hexdigest()[:8]
    return f"v{VERSIONS[asset]}-{digest}"
