"""The house rules a newcomer relies on, checked on the source itself.

- What Airflow imports (`plugins/interlude`) never imports the test and dev tooling, and installs and imports
  with the runtime dependencies alone (a real wheel, in a venv of its own).
- No import cycle inside the package: the graph of every import, module-level and in functions alike, has no
  loop; no function imports a sibling's private name (the sign of a loop lived with).
- A small top level (rooms by concern), and a README for users whose every path exists.
- No verdict depends on this machine's speed: tests/test_house_timing.py (issue 44).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "plugins" / "interlude"
TOOLING = {"interlude_dev", "tests", "benchmarks", "pytest", "hypothesis", "playwright", "_pytest"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("interlude", *path.relative_to(PACKAGE).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path) -> Iterator[tuple[str, list[str], bool]]:
    """(imported module, imported names, inside a function) for every import statement of one module."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], id(node) in in_function
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield base, [a.name for a in node.names], id(node) in in_function


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for module, names, _ in _imports(name, path):
            for candidate in [f"{module}.{n}" for n in names] + [module]:
                if candidate in modules and candidate != name:
                    edges.add(candidate)
                    break
        graph[name] = edges
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo.extend(graph.get(v, ()))
    return seen


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops: groups of modules that each reach the others (strongly connected, more than one)."""
    reach = {v: _reach(graph, v) for v in graph}
    loops = {tuple(sorted({v} | {w for w in reach[v] if v in reach.get(w, set())})) for v in graph if v in reach[v]}
    return sorted(list(loop) for loop in loops if len(loop) > 1)


def test_the_graph_sees_imports_in_functions_and_finds_a_loop() -> None:
    """The checker itself: a loop made only of function-level imports is found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _graph()
    assert "interlude.training.tasks" in graph and graph["interlude.training.tasks"], "the graph reads imports"


def test_no_import_cycle_inside_the_package() -> None:
    assert _cycles(_graph()) == []


def test_the_shipped_package_never_imports_test_or_dev_tooling() -> None:
    bad = [
        f"{name}: {module}"
        for name, path in _modules().items()
        for module, _, _ in _imports(name, path)
        if module.split(".")[0] in TOOLING
    ]
    assert bad == []


def test_no_function_imports_a_siblings_private_name() -> None:
    bad = [
        f"{name}: from {module} import {n}"
        for name, path in _modules().items()
        for module, names, in_function in _imports(name, path)
        if in_function and module.startswith("interlude")
        for n in names
        if n.startswith("_")
    ]
    assert bad == []


def test_the_top_level_is_rooms_not_a_flat_list() -> None:
    entries = [
        p for p in PACKAGE.iterdir() if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()
    ]
    assert len(entries) <= 14, sorted(p.name for p in entries)


def test_every_room_has_a_readme_table() -> None:
    for room in ("capacity", "stage", "machines", "training", "serving", "ui"):
        readme = (PACKAGE / room / "README.md").read_text()
        listed = set(re.findall(r"^\| `(\w+)\.py` \|", readme, re.M))
        modules = {p.stem for p in (PACKAGE / room).glob("*.py") if p.name != "__init__.py"}
        assert modules <= listed, f"{room}/README.md does not list {sorted(modules - listed)}"


_PATH = re.compile(r"`((?:dags|plugins|include|tests|benchmarks|docs)/[\w./-]*)`|`(\w[\w-]*\.(?:md|yaml|toml|txt))`")


def test_the_readme_is_for_users_and_every_path_it_names_exists() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dated entries belong in docs/history or commit messages"
    named = [m.group(1) or m.group(2) for m in _PATH.finditer(text)]
    assert len(named) > 20, named
    missing = [p for p in named if not (ROOT / p.split("::")[0]).exists()]
    assert missing == []


@pytest.mark.e2e
def test_the_package_installs_and_imports_with_its_runtime_dependencies_alone(tmp_path: Path) -> None:
    """A real wheel of the project in a venv of its own, with requirements.txt's dependencies only: every module
    imports, the package data (runtime tables, schemas, scripts, scenarios) is there, and no tooling is."""
    uv = Path(sys.executable).with_name("uv")
    venv = tmp_path / "venv"
    subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [str(uv), "pip", "install", "-q", "--python", str(python), "-c", str(ROOT / "constraints.txt"), str(ROOT)]
    subprocess.run(install, check=True, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    probe = """
import importlib, importlib.util, pkgutil, interlude
names = [m.name for m in pkgutil.walk_packages(interlude.__path__, "interlude.")]
for name in names:
    importlib.import_module(name)
for tooling in ("interlude_dev", "pytest", "playwright", "hypothesis"):
    assert importlib.util.find_spec(tooling) is None, tooling
from interlude.runtimes import DEFAULT_TABLE_PATH
from interlude.serving import entrypoints, tables, validate
assert "site-packages" in str(DEFAULT_TABLE_PATH) and DEFAULT_TABLE_PATH.read_text()
tables.load_table(); entrypoints.load_scripts(); assert list(validate.SCHEMA_DIR.glob("*.json"))
from importlib import resources
assert list((resources.files("interlude_localcloud") / "scenarios").iterdir())
print(len(names))
"""
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 60
