"""Every Interlude operator, sensor and trigger documents its arguments the way the Google provider does.

Issue 33.5: a DAG author reads the class docstring (in the editor, in the API docs) to learn what an argument
means, its units and what ``None`` does. So each class's own docstring carries one ``:param NAME:`` line per
``__init__`` argument, and none for a name the constructor no longer takes (a stale line misleads as much as a
missing one). An argument a subclass forwards through ``**kwargs`` to an Interlude base class (RolloutTrigger to
_ClusterTrigger) is one the caller must pass, so it is documented there too, as the Google provider documents its
mixins' arguments on every operator; what reaches Airflow's own BaseOperator (task_id, retries) Airflow documents.
The classes are found by walking the three packages, so an operator added later is checked without touching
this file.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import pytest
from airflow.sdk import BaseOperator
from airflow.triggers.base import BaseTrigger

import interlude.operators
import interlude.sensors
import interlude.triggers

PACKAGES: tuple[ModuleType, ...] = (interlude.operators, interlude.sensors, interlude.triggers)
# The docstring field list the Google provider (and Sphinx) uses: ":param name: text", at a line's start.
PARAM_LINE = re.compile(r"^\s*:param\s+(?:[^\s:]+\s+)?(\w+)\s*:", re.MULTILINE)
SKIPPED_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _modules() -> list[ModuleType]:
    found = []
    for package in PACKAGES:
        for info in pkgutil.iter_modules(package.__path__, prefix=f"{package.__name__}."):
            found.append(importlib.import_module(info.name))
    return found


def _documented_classes() -> list[type]:
    """The operator, sensor and trigger classes defined (not merely imported) in the three packages."""
    classes: dict[str, type] = {}
    for module in _modules():
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ != module.__name__:
                continue
            if issubclass(obj, (BaseOperator, BaseTrigger)) and obj not in (BaseOperator, BaseTrigger):
                classes[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [classes[name] for name in sorted(classes)]


def _init_params(cls: type) -> set[str]:
    """The named arguments of the class's constructor and of the Interlude constructors it forwards ``**kwargs`` to."""
    names: set[str] = set()
    for owner in [k for k in cls.__mro__ if "__init__" in vars(k)]:
        if not owner.__module__.startswith("interlude."):
            break  # Airflow's BaseOperator / BaseTrigger: documented by Airflow
        parameters = inspect.signature(owner.__init__).parameters  # type: ignore[misc]
        names |= {name for name, p in parameters.items() if name != "self" and p.kind not in SKIPPED_KINDS}
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            break
    return names


def _doc_params(cls: type) -> list[str]:
    # The class's own docstring: inspect.getdoc would fall back to a parent's text and hide a missing one.
    return PARAM_LINE.findall(cls.__dict__.get("__doc__") or "")


CLASSES = _documented_classes()


def test_the_walk_finds_the_operators_sensors_and_triggers() -> None:
    """A broken walk (a renamed package, a failed import filter) would otherwise pass vacuously."""
    names = {cls.__name__ for cls in CLASSES}
    assert CLASSES, "no operator, sensor or trigger class found under interlude.operators/sensors/triggers"
    assert any(issubclass(cls, BaseTrigger) for cls in CLASSES), names
    assert any(issubclass(cls, BaseOperator) for cls in CLASSES), names
    assert {"StageTrigger", "CommittedCheckpointSensor"} <= names, names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
def test_docstring_has_a_param_line_for_every_init_argument(cls: type) -> None:
    expected = _init_params(cls)
    documented = _doc_params(cls)
    missing = sorted(expected - set(documented))
    stale = sorted(set(documented) - expected)
    repeated = sorted({name for name in documented if documented.count(name) > 1})
    assert not missing, f"{cls.__qualname__} docstring lacks :param for {missing}"
    assert not stale, f"{cls.__qualname__} docstring has :param for {stale}, which __init__ does not take"
    assert not repeated, f"{cls.__qualname__} docstring repeats :param for {repeated}"
