"""The layers point one way: nothing under pretrain/ imports transfer (not even inside a
function), nothing imports tools/ or benchmarks/ (scripts, not packages: a test runs a benchmark
as a script), no module imports itself through others (no import circle, not even one that only
a function-level or ``TYPE_CHECKING`` import closes), and every room imports only the rooms its
docstring's "May import:" line names, each below it. Read from the source with ast, so an import
that never runs is found as well."""

from __future__ import annotations

import ast
import graphlib
import re
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
                if first in ("tools", "benchmarks"):
                    violations.append(f"{rel}:{line}: imports {module} ({first} are scripts)")
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


def test_pretrain_never_imports_transfer_and_nothing_imports_tools_or_benchmarks():
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
        "from pretrain.utils.errors import LoracError\n"
    )
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test():\n    from tools import train_net\nfrom benchmarks.bench_step import measure\n"
    )
    (tmp_path / "tools" / "run.py").write_text("import tools.demo\n")
    assert layer_violations(tmp_path) == [
        "pretrain/bad.py:3: imports transfer.classification (pretrain is below transfer)",
        "pretrain/bad.py:6: imports transfer (pretrain is below transfer)",
        "pretrain/bad.py:7: imports transfer.cli.demo (pretrain is below transfer)",
        "tools/run.py:1: imports tools.demo (tools are scripts)",
        "tests/test_x.py:2: imports tools (tools are scripts)",
        "tests/test_x.py:3: imports benchmarks.bench_step (benchmarks are scripts)",
    ]


# A room's rule: its __init__ docstring's paragraph that starts "May import:"; the rooms it may
# import are the :mod:`...` names in that paragraph (``...`` names are prose, e.g. the rooms it
# may not import). No name: nothing from the project.
_MAY_IMPORT = re.compile(r"^May import:(.*?)(?:\n[ \t]*\n|\Z)", re.M | re.S)
_MOD_NAME = re.compile(r":mod:`~?([\w.]+)`")
ROOM_TOPS = ("pretrain", "transfer")


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""


def room_rules(root: Path, top: str) -> dict[str, list[str] | None]:
    """Room (``top.name``, a subpackage of ``top``) -> the project modules its "May import:"
    paragraph names, or None where its docstring has no such paragraph."""
    rules: dict[str, list[str] | None] = {}
    for init in sorted((root / top).glob("*/__init__.py")):
        found = _MAY_IMPORT.search(_docstring(init))
        rules[f"{top}.{init.parent.name}"] = _MOD_NAME.findall(found[1]) if found else None
    return rules


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def may_import_violations(root: Path, tops: tuple[str, ...] = ROOM_TOPS) -> list[str]:
    """``"path:line: imports module (room may not)"`` for every import (at any depth) of a
    project module that is neither in the importing room nor under a module its rule names.
    Rooms without a rule are not checked; standard-library and third-party imports are free."""
    violations = []
    for top in tops:
        for room, allowed in room_rules(root, top).items():
            if allowed is None:
                continue
            for path in sorted((root / room.replace(".", "/")).rglob("*.py")):
                rel = path.relative_to(root).as_posix()
                for line, module in _imported_modules(ast.parse(path.read_text(), filename=rel)):
                    if module.split(".")[0] not in tops or _within(module, room):
                        continue
                    if not any(_within(module, a) for a in allowed):
                        violations.append(f"{rel}:{line}: imports {module} ({room} may not)")
    return violations


def test_every_room_imports_only_what_its_docstring_allows():
    rules = room_rules(ROOT, "pretrain")
    assert {"pretrain.utils", "pretrain.engine", "pretrain.cluster"} <= set(rules)  # really read
    assert [r for r, allowed in rules.items() if allowed is None] == [], "no May import: line"
    assert sorted(p.name for p in (ROOT / "pretrain").glob("*.py")) == ["__init__.py"]  # rooms only
    # transfer's rooms are checked too once their docstrings carry a "May import:" line
    assert may_import_violations(ROOT) == []


def test_room_rules_point_down_in_the_documented_order():
    """pretrain/__init__.py lists the rooms bottom to top; every room's rule names only rooms
    listed before it, so the rules themselves hold no circle and no arrow up."""
    order = [
        f"pretrain.{n}"
        for n in re.findall(r"^\* ``(\w+)``:", _docstring(ROOT / "pretrain" / "__init__.py"), re.M)
    ]
    rules = room_rules(ROOT, "pretrain")
    assert sorted(order) == sorted(rules)  # every room listed once
    up = [
        f"{room} may import {a}"
        for room, allowed in rules.items()
        for a in allowed or []
        if not any(_within(a, below) for below in order[: order.index(room)])
    ]
    assert up == []


def test_the_may_import_check_can_fail(tmp_path):
    """A synthetic tree: imports at module level and inside a function of rooms not named by the
    rule are reported, with their line; the room's own modules, stdlib and third-party packages,
    a named room's submodules, names after the rule's paragraph and rooms without a rule are
    not."""
    for top in ROOM_TOPS:
        (tmp_path / top).mkdir()
    rooms = {
        "pretrain/utils": "Basics.\n\nMay import: nothing from the project.",
        "pretrain/data": "Data.\n\nMay import: :mod:`pretrain.utils`; not ``pretrain.engine``.",
        "pretrain/engine": (
            "Engine.\n\nMay import: :mod:`pretrain.data`,\n:mod:`pretrain.utils`.\n\n"
            "Run by :mod:`pretrain.cli`."
        ),
        "transfer/analysis": "No rule here.",
    }
    for room, doc in rooms.items():
        (tmp_path / room).mkdir()
        (tmp_path / room / "__init__.py").write_text(f'"""{doc}\n"""\n')
    files = {
        "pretrain/utils/ok.py": "import os\nimport torch\nfrom pretrain.utils import x\n",
        "pretrain/utils/bad.py": "def f():\n    from pretrain.data.loader import g\n",
        "pretrain/data/loader.py": (
            "from pretrain.utils.signals import shield\n"
            "from . import sampler\n"
            "import pretrain.engine.hooks\n"
        ),
        "pretrain/engine/trainer.py": (
            "import pretrain.data.loader\n"
            "def f():\n"
            "    import pretrain.cli.main\n"
            "    import transfer.study\n"
        ),
        "transfer/analysis/report.py": "import transfer.study\n",
    }
    for path, text in files.items():
        (tmp_path / path).write_text(text)
    rules = room_rules(tmp_path, "pretrain")
    assert rules["pretrain.engine"] == ["pretrain.data", "pretrain.utils"]
    assert rules["pretrain.utils"] == []
    assert may_import_violations(tmp_path) == [
        "pretrain/data/loader.py:3: imports pretrain.engine.hooks (pretrain.data may not)",
        "pretrain/engine/trainer.py:3: imports pretrain.cli.main (pretrain.engine may not)",
        "pretrain/engine/trainer.py:4: imports transfer.study (pretrain.engine may not)",
        "pretrain/utils/bad.py:2: imports pretrain.data.loader (pretrain.utils may not)",
    ]


# -- function length (no function in pretrain/ or transfer/ over 80 lines) -------------------

MAX_FUNCTION_LINES = 80


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``file:line name (N lines)`` of every function under ``root`` longer than ``limit``
    (decorators excluded, docstring included)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_over_80_lines():
    assert long_functions(ROOT / "pretrain") + long_functions(ROOT / "transfer") == []


def test_the_length_check_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n")
    assert long_functions(tmp_path) == [f"{tmp_path / 'm.py'}:1 f (81 lines)"]
