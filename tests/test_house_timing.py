"""No verdict depends on this machine's speed (issue 44): outside `tests/benchmarks/`, no test asserts a duration
or a CPU figure measured on this machine. A test asserts facts and their order (which step was committed before
what, what the cloud listed, what the workload logged); speed belongs to `benchmarks/` and their smoke tests.

The rule, over the AST of every `tests/**/*.py` but `tests/benchmarks/`: a verdict (an `assert`, or an `if` whose
body is `pytest.fail(...)` or `raise AssertionError(...)`) must not order (`<`, `<=`, `>`, `>=`) a measured figure
against anything but 0. Measured, within one test function (its nested functions included):

- an *instant*: a read of this machine's clock or CPU count (`time.monotonic/time/perf_counter/process_time/
  thread_time` and their `_ns`, `os.times`, `resource.getrusage`, psutil's `cpu_times/cpu_percent`,
  `datetime.now/utcnow`, called through the module or imported by name), a record's own clock reading (the local
  cloud's `["now"]`: its scenario clock runs on this machine's time), or a name the function assigned (appended,
  stored an item in) from one. Instants ordered against each other or against a record's stamps are order, a
  fact (`t0 <= machine["created"] <= t1`); against a constant of the test's own (`time.process_time() < 5`)
  they are a window.
- a *clock figure*: arithmetic on an instant (`time.monotonic() - started`, `deadline = time.monotonic() + 30`,
  `waited = inserts[1]["t"] - deleted[0]` after `deleted.append(time.time())`), or a name assigned from one: a
  duration or a deadline, whatever it is compared with.
- a *named figure*: a name, attribute or record field whose own name only a measurement has (a word `elapsed`,
  `took`, `waited`, `wall`, `cpu`, `latency`, or `per_second`: `proc.cpu_seconds`,
  `progress["steps_per_second"]`); seconds read from a record by key (`result["seconds"]`; records, a
  workload's progress.json, the cloud's event log, a subprocess's JSON, hold what happened on this machine); and
  seconds (`*_s`, `*_seconds`, `*_ms`) read from what ran, i.e. from a value the test's fixtures fed
  (`policy.idle_s` where `policy` came from the fixture's cloud).

Permitted, and why:

- A hang guard in a polling loop: an assert (or `if ...: pytest.fail(...)`) inside a `for`/`while` body, with a
  message, that says the clock has not passed a deadline (`assert time.monotonic() < deadline, "what never
  happened"`: the clock on the smaller side). It fails only when something never happens, and says what. A
  `while` condition is no verdict at all.
- Comparisons with 0 (`event["downtime_s"] > 0`): that there was downtime is a fact, not a speed.
- Equality (`==`, `pytest.approx`): a fake or injected clock in a pure test gives exact values
  (`Clock.now == 20 * step + late`), and `Clock.monotonic()` (a class of the test's own) is not this machine's clock.
- Figures of pure functions and of the test's own values: `plan.keep_training_s >= 0.95 * HOUR`,
  `row.unscheduled_notice_s <= row.scheduled_notice_s`, `plan.margin_s >= 2 * commit_s` with a parametrized
  `commit_s`. A plan computed from constants is a decision, the same on any machine; its `_s` names are neither
  measurement words nor record fields nor fed by a fixture, so they are not measured.

There is no allowlist: an offender is fixed, or its figure moves to a benchmark and its smoke test. The rule reads
the source, not the values: it is a tripwire for the ways such checks are written, not a proof (a window written
as arithmetic on a record's stamp, `event["t"] - 5 <= started`, reads as order to it).
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
EXEMPT_DIR = TESTS / "benchmarks"

_TIME = ("monotonic", "perf_counter", "process_time", "thread_time", "time", "clock_gettime")
# Clock and CPU reads of this machine, by module: called through it (`time.monotonic()`, `dt.datetime.now()`) or
# imported from it by name (`from time import monotonic`).
CLOCK_CALLS = {
    "time": {*_TIME, *(f"{f}_ns" for f in _TIME)},
    "os": {"times"},
    "resource": {"getrusage"},
    "datetime": {"now", "utcnow"},
    "timezone": {"utcnow"},  # airflow.utils.timezone
    "pendulum": {"now"},
}
CLOCK_METHODS = {"cpu_times", "cpu_percent", "getrusage"}  # psutil's, on a Process or the module
# Calls that keep what they are given an instant or a figure (`float(t)`, `max(stamps)`, `t.timestamp()`).
KEEPS = {"float", "int", "abs", "round", "min", "max", "sum", "sorted", "list", "tuple", "timedelta"} | {
    "fromtimestamp",
    "utcfromtimestamp",
    "timestamp",
    "total_seconds",
    "mktime",
    "gmtime",
    "localtime",
    "mean",
    "median",
    "fmean",
}
RECORD_CLOCKS = {"now"}  # a record's own clock reading
MEASURE_WORDS = {"elapsed", "took", "waited", "wall", "cpu", "latency"}  # words of a name, split on "_"
MEASURE_PHRASES = ("per_second",)
SECONDS = re.compile(r"(^seconds|_seconds|_secs|_s|_ms)$")
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
INSTANT, FIGURE = 1, 2
APPENDS = {"append", "extend", "add", "put", "put_nowait", "appendleft", "insert"}
Flow = tuple[list[str], ast.AST]  # (names written, the value written into them)


def _dotted(node: ast.AST) -> list[str]:
    """`a.b.c` as ["a", "b", "c"]; [] for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else []


def _root(node: ast.AST) -> str | None:
    """The variable an expression reads from: `a` of `a.b["c"].d()`."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _measure_word(name: str) -> bool:
    words = set(name.lower().split("_"))
    return bool(words & MEASURE_WORDS) or any(p in name.lower() for p in MEASURE_PHRASES)


class _Clocks:
    """What a module imported from the clock modules, by local name."""

    def __init__(self, tree: ast.Module) -> None:
        self.modules = {"datetime": "datetime", "timezone": "timezone"}  # local name -> clock module
        self.functions: set[str] = set()  # `from time import monotonic`
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    last = alias.name.split(".")[-1]
                    if last in CLOCK_CALLS:
                        self.modules[alias.asname or alias.name.split(".")[0]] = last
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if alias.name in CLOCK_CALLS:  # from datetime import datetime; from airflow.utils import timezone
                        self.modules[alias.asname or alias.name] = alias.name
                    elif alias.name in CLOCK_CALLS.get(node.module.split(".")[-1], ()):
                        self.functions.add(alias.asname or alias.name)

    def read(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        if isinstance(node.func, ast.Attribute) and node.func.attr in CLOCK_METHODS:
            return True
        name = _dotted(node.func)
        if len(name) == 1:
            return name[0] in self.functions
        # `time.monotonic()`, `dt.datetime.now()`; not `Clock.monotonic()`, a class of the test's own
        module = self.modules.get(name[-2]) if len(name) > 1 and name[0] in self.modules else None
        return module is not None and name[-1] in CLOCK_CALLS[module]


def _stored(target: ast.AST) -> Iterator[str]:
    """The local names a target writes (`a`, `a, b`, `a[k]`, `a.x` all write into `a`)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _stored(elt)
    elif isinstance(target, (ast.Starred, ast.Subscript, ast.Attribute)):
        yield from _stored(target.value)


def _assigned(node: ast.AST) -> list[Flow]:
    if isinstance(node, ast.Assign):
        out: list[Flow] = []
        for target in node.targets:
            value = node.value
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                out.extend((list(_stored(t)), v) for t, v in zip(target.elts, value.elts, strict=True))
            else:
                out.append((list(_stored(target)), value))
        return out
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        return [(list(_stored(node.target)), node.value)]
    if isinstance(node, ast.NamedExpr):
        return [([node.target.id], node.value)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in APPENDS and node.args:
        return [(list(_stored(node.func.value)), node.args[-1])]
    return []


def _flows(function: ast.AST) -> list[Flow]:
    """Every value written into a name: assignments (tuples pair up element by element), walrus, `x.append(v)`."""
    return [flow for node in ast.walk(function) for flow in _assigned(node)]


def _iterations(function: ast.AST) -> list[Flow]:
    """(loop variables, what they iterate) of every `for` and comprehension; `with ... as x`."""
    out: list[Flow] = []
    for node in ast.walk(function):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            out.append((list(_stored(node.target)), node.iter))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            out.extend((list(_stored(i.optional_vars)), i.context_expr) for i in node.items if i.optional_vars)
    return out


def _fixtures(function: ast.AST) -> set[str]:
    """The parameters of a function but its `@pytest.mark.parametrize` names: what ran (clouds, stacks, buckets,
    processes; a helper's caller's values), not values of the test's own."""
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    args = function.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, [args.vararg, args.kwarg])]}
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Call) and _dotted(decorator.func)[-1:] == ["parametrize"] and decorator.args:
            first = decorator.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names -= {n.strip() for n in first.value.split(",")}
            elif isinstance(first, (ast.Tuple, ast.List)):
                names -= {e.value for e in first.elts if isinstance(e, ast.Constant)}
    return names - {"self", "cls"}


def _fixpoint(flows: list[Flow], value_of: dict[str, int], kind: Callable[[ast.AST], int]) -> None:
    """Raise each name to the most any value written into it has, until nothing changes."""
    changed = True
    while changed:
        changed = False
        for names, value in flows:
            got = kind(value)
            for name in names:
                if got > value_of.get(name, 0):
                    value_of[name] = got
                    changed = True


class _Function:
    """One function's names: what holds an instant or a clock figure, and what its fixtures fed."""

    def __init__(self, clocks: _Clocks, function: ast.AST) -> None:
        self.clocks, self.function = clocks, function
        self.flows = _flows(function)
        self.kinds: dict[str, int] = {}
        _fixpoint(self.flows, self.kinds, self.kind)

    @functools.cached_property
    def fed(self) -> set[str]:
        fed = dict.fromkeys(_fixtures(self.function), 1)
        flows = [*self.flows, *_iterations(self.function)]
        _fixpoint(flows, fed, lambda v: int(any(_root(n) in fed for n in ast.walk(v))))
        return set(fed)

    def kind(self, node: ast.AST) -> int:
        """INSTANT, FIGURE (arithmetic on an instant) or 0."""
        if self.clocks.read(node):
            return INSTANT
        if isinstance(node, ast.Name):
            return self.kinds.get(node.id, 0)
        if isinstance(node, ast.Subscript):
            key = node.slice.value if isinstance(node.slice, ast.Constant) else None
            return INSTANT if key in RECORD_CLOCKS else self.kind(node.value)
        if isinstance(node, ast.BinOp):
            return FIGURE if self.kind(node.left) or self.kind(node.right) else 0
        return max(map(self.kind, self._parts(node)), default=0)

    @staticmethod
    def _parts(node: ast.AST) -> list[ast.AST]:
        """What an expression's instant or figure would come from."""
        if isinstance(node, (ast.Attribute, ast.Starred, ast.Await)):
            return [node.value]
        if isinstance(node, ast.UnaryOp):
            return [node.operand]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return list(node.elts)
        if isinstance(node, ast.BoolOp):
            return list(node.values)
        if isinstance(node, ast.IfExp):
            return [node.body, node.orelse]
        if isinstance(node, ast.Call) and (_dotted(node.func) or [getattr(node.func, "attr", "")])[-1] in KEEPS:
            receiver = [node.func.value] if isinstance(node.func, ast.Attribute) else []
            return [*node.args, *(k.value for k in node.keywords), *receiver]
        return []

    def named_figure(self, node: ast.AST) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
                if _measure_word(n.slice.value) or SECONDS.search(n.slice.value):
                    return True
            name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
            if name and (_measure_word(name) or (SECONDS.search(name) and _root(n) in self.fed)):
                return True
        return False

    def offends(self, left: ast.expr, op: ast.cmpop, right: ast.expr, negated: bool, guard: bool) -> bool:
        kinds = (self.kind(left), self.kind(right))
        if FIGURE in kinds:  # a duration or a deadline: against anything but 0
            bad = (kinds[0] == FIGURE and not _is_zero(right)) or (kinds[1] == FIGURE and not _is_zero(left))
        elif INSTANT in kinds:  # instants against each other or a record's stamps: order; against a number: a window
            bad = (kinds[0] and _number(right)) or (kinds[1] and _number(left))
        else:  # a named figure: against anything but 0
            bad = (self.named_figure(left) and not _is_zero(right)) or (self.named_figure(right) and not _is_zero(left))
        if bad and guard:  # a hang guard: the clock on the smaller side of what is asserted
            smaller = left if isinstance(op, (ast.Lt, ast.LtE)) != negated else right
            return not self.kind(smaller)
        return bool(bad)


def _is_zero(node: ast.AST) -> bool:
    """0, 0.0, -0, `timedelta(0)`, `timedelta()`."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    if isinstance(node, ast.Call) and _dotted(node.func)[-1:] == ["timedelta"]:
        return all(_is_zero(a) for a in [*node.args, *(k.value for k in node.keywords)])
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == 0


def _constant(node: ast.AST) -> bool:
    """A value of the test's own: literals and CONSTANTS, and arithmetic or calls (`timedelta(days=1)`) on them."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id.isupper() and len(node.id) > 1
    if isinstance(node, ast.BinOp):
        return _constant(node.left) and _constant(node.right)
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand)
    if isinstance(node, ast.Call):
        return all(_constant(a) for a in [*node.args, *(k.value for k in node.keywords)])
    return False


def _number(node: ast.AST) -> bool:
    """A number of the test's own (not 0): what an instant against it makes a window."""
    return _constant(node) and not _is_zero(node)


def _fails(stmt: ast.stmt) -> str:
    """Whether the statement fails the test (`pytest.fail`, `raise AssertionError`): "message", "bare" or ""."""
    if (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and _dotted(stmt.value.func) == ["pytest", "fail"]
    ):
        call: ast.expr = stmt.value
    elif isinstance(stmt, ast.Raise) and stmt.exc is not None:
        call = stmt.exc
        if _dotted(call.func if isinstance(call, ast.Call) else call) != ["AssertionError"]:
            return ""
    else:
        return ""
    return "message" if isinstance(call, ast.Call) and (call.args or call.keywords) else "bare"


Verdict = tuple[ast.expr, bool, bool, bool]  # (condition, negated, inside a loop, with a message)


def _verdicts(node: ast.AST, in_loop: bool = False) -> Iterator[Verdict]:
    """Each assert of a function (and of the functions nested in it), and each `if` whose body fails the test."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Assert):
            yield child.test, False, in_loop, child.msg is not None
        elif isinstance(child, ast.If) and child.body and _fails(child.body[0]):
            yield child.test, True, in_loop, _fails(child.body[0]) == "message"
        nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        loop = isinstance(child, (ast.For, ast.AsyncFor, ast.While))
        yield from _verdicts(child, False if nested else in_loop or loop)


def _units(tree: ast.Module) -> list[ast.AST]:
    """The functions (each with the functions nested in it), and the module's own statements."""
    functions: list[ast.AST] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append(node)
        elif isinstance(node, ast.stmt):
            todo.extend(ast.iter_child_nodes(node))  # a class's methods, a function under `if`
    statements = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return [ast.Module(body=statements, type_ignores=[]), *functions]


def offenders(source: str, path: str = "<snippet>") -> list[str]:
    """`path:line: comparison` for each verdict on a figure measured on this machine."""
    tree = ast.parse(source)
    clocks = _Clocks(tree)
    out: set[tuple[int, str]] = set()
    for unit in _units(tree):
        ordered = [
            (compare, negated, in_loop and has_message)
            for test, negated, in_loop, has_message in _verdicts(unit)
            for compare in ast.walk(test)
            if isinstance(compare, ast.Compare) and any(isinstance(op, ORDERING) for op in compare.ops)
        ]
        if not ordered:
            continue
        fn = _Function(clocks, unit)
        for compare, negated, guard in ordered:
            operands = [compare.left, *compare.comparators]
            if any(
                isinstance(op, ORDERING) and fn.offends(left, op, right, negated, guard)
                for left, right, op in zip(operands, operands[1:], compare.ops, strict=False)
            ):
                out.add((compare.lineno, ast.unparse(compare)))
    return [f"{path}:{line}: {text}" for line, text in sorted(out)]


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if EXEMPT_DIR not in p.parents)


def test_no_test_outside_the_benchmarks_asserts_a_duration_or_cpu_figure_of_this_machine() -> None:
    found = [o for p in _test_files() for o in offenders(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == [], "\n".join(
        ["verdicts on this machine's speed (assert facts and their order; figures go to benchmarks/):", *found]
    )


# The rule itself, on snippets (each after IMPORTS): each flagged, each permitted, and why.
IMPORTS = "import datetime as dt, os, re, resource, time\nimport psutil, pytest\n"
FLAGGED = {
    "a wall-clock window": """
        def test_x():
            started = time.monotonic()
            run()
            assert time.monotonic() - started < 5
    """,
    "a lower bound on a duration": """
        def test_x():
            started = time.monotonic()
            run()
            assert time.monotonic() - started >= 2.5
    """,
    "a duration imported by name and aliased": """
        from time import perf_counter as pc

        def test_x():
            t = pc()
            run()
            elapsed = pc() - t
            assert elapsed <= 1.0
    """,
    "CPU of a thread, names paired in tuples": """
        def test_x():
            cpu, wall = time.thread_time(), time.monotonic()
            run()
            cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
            assert wall >= 0.9
    """,
    "a stamp appended to a list, subtracted from a record's": """
        def test_x(cloud):
            deleted = []
            deleted.append(time.time())
            waited = cloud.events()[1]["t"] - deleted[0]
            assert 0 < waited < 20
    """,
    "a record's seconds by key": """
        def test_x(parsed):
            result = parsed["dags/a.py"]
            assert result["seconds"] < 5.0
    """,
    "a record field with a measure word": """
        def test_x(store):
            progress = store.read_progress()
            assert 0 < progress["steps_per_second"] < 12
    """,
    "a CPU figure against another plus a tolerance": """
        def test_x(server):
            proc = server.start()
            assert own <= proc.cpu_seconds < own + 0.5
    """,
    "seconds of what the fixture ran, against each other": """
        def test_x(stage_stack):
            policy, old = run(stage_stack, "a"), run(stage_stack, "b")
            assert policy.lost_s < old.lost_s
    """,
    "a datetime age": """
        def test_x(latest):
            age = dt.datetime.now(dt.UTC) - latest
            assert dt.timedelta(0) <= age <= dt.timedelta(days=1)
    """,
    "the process's CPU so far": """
        def test_x():
            run()
            assert resource.getrusage(resource.RUSAGE_SELF).ru_utime < 3
    """,
    "psutil's CPU": """
        def test_x():
            assert psutil.Process().cpu_times().user < 1
    """,
    "a pytest.fail on a duration": """
        def test_x():
            started = time.monotonic()
            run()
            if time.monotonic() - started > 5:
                pytest.fail("too slow")
    """,
    "a deadline checked after the loop": """
        def test_x():
            deadline = time.monotonic() + 30
            while not done():
                time.sleep(0.1)
            assert time.monotonic() < deadline, "done too late"
    """,
    "a guard in a loop without a message": """
        def test_x():
            deadline = time.monotonic() + 30
            while not done():
                assert time.monotonic() < deadline
    """,
    "the clock on the larger side, in a loop": """
        def test_x():
            started = time.monotonic()
            for _ in range(3):
                run()
                assert time.monotonic() - started > 0.5, "too fast"
    """,
    "the cloud's scenario clock": """
        def test_x(lc):
            evicted_at = lc.admin.gke_events()["now"]
            wait()
            assert lc.admin.gke_events()["now"] - evicted_at < 3600
    """,
    "a latency parsed from a log": """
        def test_x(cloud):
            latency = re.search(r"notice-to-commit (\\d+)s", log)
            assert float(latency.group(1)) < 2.0
    """,
    "a window inside a nested function": """
        def test_x():
            started = time.monotonic()

            def check():
                assert time.monotonic() - started < 1

            check()
    """,
}
PERMITTED = {
    "a hang guard in a polling loop, with a message": """
        def test_x():
            deadline = time.monotonic() + 10
            while not done():
                assert time.monotonic() < deadline, "never done"
                time.sleep(0.1)
    """,
    "a pytest.fail hang guard in a polling loop": """
        def test_x():
            started = time.monotonic()
            while not done():
                if time.monotonic() - started > 60:
                    pytest.fail("never done")
    """,
    "a while condition": """
        def test_x():
            started = time.monotonic()
            while time.monotonic() - started < 30 and not done():
                time.sleep(0.1)
            assert done()
    """,
    "order of instants and a record's stamps": """
        def test_x(cloud):
            t0 = time.time()
            create()
            t1 = time.time()
            a = cloud.lifetimes()[0]
            assert t0 <= a["created"] <= t1 < a["deleted"]
    """,
    "comparisons with 0": """
        def test_x(store):
            started = time.monotonic()
            event = store.events()[0]
            assert event["downtime_s"] > 0 and time.monotonic() - started > 0
    """,
    "a fake clock": """
        def test_x():
            class Clock:
                now = 0.0

                @classmethod
                def monotonic(cls):
                    return cls.now

            run(Clock)
            assert Clock.now == 20 * 0.0625 + 0.0078125
            assert Clock.monotonic() < 5
    """,
    "a pure plan from constants": """
        def test_x():
            plan = plan_for_notice(KIND, notice(HOUR), measured_commit_s=12.0, now=NOW)
            assert plan.keep_training_s >= 0.95 * HOUR
            assert KINDS["a"].down_budget_s > KINDS["b"].down_budget_s
    """,
    "a pure plan from a parametrized value": """
        @pytest.mark.parametrize("commit_s", [0.0, 5.0])
        def test_x(commit_s):
            plan = plan_for(commit_s)
            assert plan.margin_s >= 2 * commit_s
    """,
    "counts read from a record": """
        def test_x(store):
            progress = store.read_progress()
            assert progress["step"] >= 10 and progress["total_steps"] == 500
    """,
    "equality with a measured figure": """
        def test_x(server):
            proc = server.start()
            assert proc.cpu_seconds == pytest.approx(total)
    """,
}


@pytest.mark.parametrize("source", FLAGGED.values(), ids=FLAGGED.keys())
def test_the_rule_flags(source: str) -> None:
    assert len(offenders(IMPORTS + textwrap.dedent(source))) == 1, source


@pytest.mark.parametrize("source", PERMITTED.values(), ids=PERMITTED.keys())
def test_the_rule_permits(source: str) -> None:
    assert offenders(IMPORTS + textwrap.dedent(source)) == []
