"""What `make test-quick` leaves out: the tests that start real processes or train the workload's model.

At collection (a pytest plugin: the root conftest's `pytest_plugins`) every test gets the marks that apply:

- `processes`: it is marked `e2e` (it starts Airflow), or it starts a process in its own code, in a fixture it
  uses (directly or through other fixtures) or in a helper they call: `subprocess`, `os.fork`/`system`/
  `posix_spawn`/`exec*` or `multiprocessing`. That covers Airflow (`interlude_dev`'s `dags_test`,
  `ensure_airflow_db`, the warm CLI server), the stack, the local cloud as a process (`start_localcloud`), the
  trainers, agents and vLLM stand-in the tests start, Chromium, and every `python -c` or nested pytest.
- `model`: it uses the workload's JAX model (`interlude_workload.llm`'s `train_step`, `export`, `model`: it
  trains, exports or runs it) or Hugging Face's `transformers` or `torch`, found the same way: 5-30 CPU-s a test.

"The same way" means following what the code names (globals, modules it imports in its body, their attributes)
through the functions, classes and modules of the suite, the benchmarks and the tooling (FOLLOWED), not through
the product's packages: a local cloud in this process (`interlude_localcloud.testing`) with its in-memory GCS
emulator, and the shell scripts its machines boot, are the wire the quick loop tests. A test whose processes
come from data rather than code (a machine or GKE pod that runs the agent or the vLLM stand-in) carries
`@pytest.mark.processes` where it is written.

`pytest --quick` deselects every test with either mark, as `-m "not processes and not model"` would.
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FunctionType, ModuleType
from typing import Any

import pytest

PROCESSES, MODEL = "processes", "model"
MARKS = {
    PROCESSES: "starts real processes (tests/quick.py); `--quick` leaves it out",
    MODEL: "trains or loads the workload's model, or transformers (tests/quick.py); `--quick` leaves it out",
}
ROOT = Path(__file__).resolve().parents[1]
FOLLOWED = tuple(f"{ROOT / part}{os.sep}" for part in ("tests", "benchmarks", "include/devtools"))
_STARTERS: dict[str, frozenset[str]] = {
    "subprocess": frozenset({"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}),
    "os": frozenset({"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp"}),
    "multiprocessing": frozenset({"Process", "Pool", "get_context"}),
}
_STARTER_OBJECTS = {id(getattr(subprocess, name)) for name in _STARTERS["subprocess"]} | {
    id(getattr(os, name)) for name in _STARTERS["os"] if hasattr(os, name)
}
_MODEL_MODULES = (
    "interlude_workload.llm.train_step",
    "interlude_workload.llm.export",
    "interlude_workload.llm.model",
    "transformers",
    "torch",
)


def _in_model(qualified: str) -> bool:
    return any(qualified == m or qualified.startswith(m + ".") for m in _MODEL_MODULES)


def starts_a_process(value: Any, names: set[str]) -> bool:
    """`subprocess.run(...)`, `os.fork()`, `from subprocess import Popen`."""
    if isinstance(value, ModuleType):
        root = value.__name__.split(".")[0]
        return root in _STARTERS and bool(names & _STARTERS[root])
    return id(value) in _STARTER_OBJECTS


def uses_the_model(value: Any, names: set[str]) -> bool:
    """`train_step.train_step(...)`, `from interlude_workload.llm import export`, `import transformers` (imported
    or not yet: by the module's name, so the answer does not depend on what was collected before)."""
    if isinstance(value, ModuleType):
        value = value.__name__
    if isinstance(value, str):
        return any(_in_model(qualified) for qualified in (value, *(f"{value}.{name}" for name in names)))
    return _in_model(getattr(value, "__module__", None) or "")


def _followed(obj: Any) -> bool:
    """Defined in the suite, the benchmarks or the tooling (by file: pytest names test modules by their package)."""
    if isinstance(obj, ModuleType):
        path = getattr(obj, "__file__", None)
    elif isinstance(getattr(obj, "__code__", None), CodeType):
        path = obj.__code__.co_filename
    else:
        path = getattr(sys.modules.get(getattr(obj, "__module__", "") or ""), "__file__", None)
    return bool(path) and str(path).startswith(FOLLOWED)


def _resolve(func: Any, name: str) -> Any:
    """What a name in a function's code is: a global, or a module it imports in its body (`import subprocess` puts
    the module's name in co_names; the suite's and the tooling's are imported here, so the answer does not depend on
    what was imported before); otherwise the name itself."""
    if name in func.__globals__:
        return func.__globals__[name]
    if name not in sys.modules and name.split(".")[0] in ("tests", "benchmarks", "interlude_dev"):
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return sys.modules.get(name, name)


def _names(code: CodeType) -> Iterator[str]:
    """The global and attribute names a function's code uses, nested functions and comprehensions included."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _names(const)


class Finder:
    """Whether a function does what `leaf` recognises, itself or through what it names (memoised per function)."""

    def __init__(self, leaf: Callable[[Any, set[str]], bool]) -> None:
        self.leaf = leaf
        self._seen: dict[int, bool] = {}

    def function(self, func: Any) -> bool:
        func = inspect.unwrap(func)
        code = getattr(func, "__code__", None)
        if not isinstance(code, CodeType):
            return False
        if id(code) in self._seen:
            return self._seen[id(code)]
        self._seen[id(code)] = False  # recursion: a cycle adds nothing
        names = set(_names(code))
        found = any(self._found(_resolve(func, name), names) for name in names)
        self._seen[id(code)] = found
        return found

    def _found(self, value: Any, names: set[str], modules: frozenset[int] = frozenset()) -> bool:
        if self.leaf(value, names):
            return True
        if isinstance(value, ModuleType):
            if _followed(value) and id(value) not in modules:  # `dev.start_localcloud(...)`: what it names in it
                inner = modules | {id(value)}
                return any(self._found(vars(value)[name], names, inner) for name in names if name in vars(value))
            return False
        if isinstance(value, str) or not _followed(value):
            return False
        if isinstance(value, FunctionType):
            return self.function(value)
        if inspect.isclass(value):
            return any(self.function(member) for member in vars(value).values() if isinstance(member, FunctionType))
        return False


def found_in(item: pytest.Item, finder: Finder) -> bool:
    """Whether the test's function or a fixture of its whole closure does it. Each fixture as pytest resolves it:
    the closest definition of a name (a module's own `stage_scenario` over a conftest's), and the one it
    overrides when it requests its own name."""
    function = getattr(item, "function", None)
    if function is not None and finder.function(function):
        return True
    # `_fixtureinfo` is pytest's record of the resolved closure (pytest-asyncio and pytest-django read it too): the
    # public `fixturenames` are names only, and names repeat (`cloud` is a process in tests/faults, a local cloud in
    # this process elsewhere).
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in reversed(definitions.get(name, ())):
            if finder.function(fixturedef.func):
                return True
            if name not in fixturedef.argnames:
                break
    return False


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick", action="store_true", help="leave out the tests marked processes or model (tests/quick.py)"
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_and_select(config, items)


def mark_and_select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test `processes` and `model` where they apply; with `--quick`, deselect the marked ones."""
    finders = {PROCESSES: Finder(starts_a_process), MODEL: Finder(uses_the_model)}
    kept: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    for item in items:
        if item.get_closest_marker("e2e") is not None and item.get_closest_marker(PROCESSES) is None:
            item.add_marker(PROCESSES)
        for name, finder in finders.items():
            if item.get_closest_marker(name) is None and found_in(item, finder):
                item.add_marker(name)
        (left_out if any(item.get_closest_marker(name) for name in MARKS) else kept).append(item)
    if config.getoption("quick", False) and left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
