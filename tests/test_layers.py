"""The layers point one way: nothing under pretrain/ imports transfer (not even inside a
function), nothing imports tools/ (scripts, not a package), and no module imports itself through
others (no import circle, not even one that only a function-level or ``TYPE_CHECKING`` import
closes). Read from the source with ast, so an import that never runs is found as well."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

from tests.helpers import ROOT

WALKED = ("pretrain", "transfer", "tools", "tests")


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import at any depth (``import a.b``, ``from a.b
    import c``) and of ``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal
    name. Relative imports stay inside their own package, so they cannot cross a layer."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return sorted(found)


def layer_violations(root: Path) -> list[str]:
    """``"path:line: imports module (why)"`` for every import under ``root`` that breaks a layer."""
    violations = []
    for top in WALKED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(), filename=rel)
            for line, module in _imported_modules(tree):
                first = module.split(".")[0]
                if top == "pretrain" and first == "transfer":
                    violations.append(
                        f"{rel}:{line}: imports {module} (pretrain is below transfer)"
                    )
                if first == "tools":
                    violations.append(f"{rel}:{line}: imports {module} (tools are scripts)")
    return violations


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, tops: tuple[str, ...] = ("pretrain", "transfer")) -> dict:
    """Module -> the project modules it imports (at any depth). ``from a.b import c`` points at
    the module ``a.b.c`` when there is one (not at the package ``a.b`` it passes through), as
    import-linter and pydeps count it."""
    files = {_module_name(root, p): p for top in tops for p in (root / top).rglob("*.py")}
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package upwards
                    pkg = mod if mod in packages else mod.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            graph[mod] |= {t for t in targets if t in files and t != mod}
    return graph


def import_circle(graph: dict) -> list[str]:
    """One import circle of ``graph`` (``[a, b, ..., a]``), or [] when there is none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return []


def test_no_import_circles():
    graph = import_graph(ROOT)
    assert len(graph) > 100  # the walk really read both packages
    assert import_circle(graph) == []


def test_the_circle_check_can_fail(tmp_path):
    """A circle closed only by a function-level import, and one through a relative import, are
    found; a package whose __init__ re-exports its own submodule is no circle."""
    pkg = tmp_path / "pretrain" / "room"
    pkg.mkdir(parents=True)
    (tmp_path / "transfer").mkdir()
    (tmp_path / "pretrain" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from pretrain.room.a import f\n")
    (pkg / "a.py").write_text("from pretrain.room.b import g\ndef f():\n    pass\n")
    (pkg / "b.py").write_text("def g():\n    from pretrain.room.a import f\n")
    circle = import_circle(import_graph(tmp_path))
    assert set(circle) == {"pretrain.room.a", "pretrain.room.b"}
    (pkg / "b.py").write_text("def g():\n    pass\n")
    assert import_circle(import_graph(tmp_path)) == []
    (pkg / "b.py").write_text("from . import a\n")
    assert set(import_circle(import_graph(tmp_path))) == {"pretrain.room.a", "pretrain.room.b"}


def test_pretrain_never_imports_transfer_and_nothing_imports_tools():
    assert (ROOT / "pretrain" / "engine").is_dir()  # the walk below really reads the package
    assert layer_violations(ROOT) == []


def test_the_walker_finds_imports_at_any_depth(tmp_path):
    """Proves the check above can fail: a synthetic tree with each kind of violation, including
    imports inside a function and a method, is reported line by line; allowed imports are not."""
    for top in WALKED:
        (tmp_path / top).mkdir()
    (tmp_path / "pretrain" / "ok.py").write_text(
        "import pretrain.config\nfrom . import losses\nfrom pretrain import transfer_helpers\n"
    )
    (tmp_path / "pretrain" / "bad.py").write_text(
        "import os\n"
        "def f():\n"
        "    from transfer.classification import knn\n"
        "class A:\n"
        "    def g(self):\n"
        "        import transfer\n"
        "        return importlib.import_module('transfer.cli.demo')\n"
    )
    (tmp_path / "transfer" / "uses_pretrain.py").write_text(
        "from pretrain.errors import LoracError\n"
    )
    (tmp_path / "tests" / "test_x.py").write_text("def test():\n    from tools import train_net\n")
    (tmp_path / "tools" / "run.py").write_text("import tools.demo\n")
    assert layer_violations(tmp_path) == [
        "pretrain/bad.py:3: imports transfer.classification (pretrain is below transfer)",
        "pretrain/bad.py:6: imports transfer (pretrain is below transfer)",
        "pretrain/bad.py:7: imports transfer.cli.demo (pretrain is below transfer)",
        "tools/run.py:1: imports tools.demo (tools are scripts)",
        "tests/test_x.py:2: imports tools (tools are scripts)",
    ]
