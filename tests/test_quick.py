"""The quick loop's selection (tests/quick.py): a test that starts processes, itself, through a fixture or through
a helper, is marked `processes`, one that trains or loads the model `model`, and `--quick` leaves both out; a pure
one stays. Checked on a suite made for it (pytest in this process) and on the tooling's real process starters."""

from __future__ import annotations

from pathlib import Path

import pytest

from interlude_dev import warm_cli
from interlude_dev import wiring as dev
from interlude_localcloud.testing import running_localcloud
from tests.quick import PROCESSES, Finder, starts_a_process

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
import subprocess

import pytest


@pytest.fixture
def server():
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def through_another(server):
    return server


@pytest.fixture
def number():
    return 3
"""

TEST_MIXED = """
import pytest

from tests.include.interlude_workload.trainer_proc import run_trainer


def test_pure(number):
    assert number == 3


def test_a_process_fixture(server):
    pass


def test_a_process_fixture_through_another(through_another):
    pass


def test_a_helper_that_starts_the_trainer():
    run_trainer(["true"])


def test_subprocess_imported_in_its_body():
    import subprocess

    subprocess.run(["true"], check=True)


@pytest.mark.e2e
def test_marked_e2e():
    pass


@pytest.mark.processes
def test_marked_by_its_author():
    pass


def test_trains_the_model():
    from interlude_workload.llm import train_step

    train_step.init_state(seed=0)


def test_loads_transformers():
    import transformers

    transformers.AutoConfig
"""

TEST_OVERRIDE = """
import pytest


@pytest.fixture
def server():
    return "no process: this module's own fixture wins"


def test_a_modules_own_pure_fixture(server):
    pass
"""


def test_processes_are_left_out_of_the_quick_loop_and_pure_tests_stay(pytester: pytest.Pytester) -> None:
    pytester.syspathinsert(ROOT)  # the suite's own helpers, as `tests....`
    pytester.makeini("[pytest]\nmarkers =\n    e2e: starts Airflow\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_mixed=TEST_MIXED, test_override=TEST_OVERRIDE)

    quick = pytester.runpytest_inprocess(
        "-p", "tests.quick", "--quick", "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    assert quick.ret == 0, quick.stdout.str()
    kept = {line for line in quick.stdout.lines if "::" in line}
    assert kept == {"test_mixed.py::test_pure", "test_override.py::test_a_modules_own_pure_fixture"}
    quick.stdout.fnmatch_lines(["2/10 tests collected (8 deselected)*"])

    # The marks are there without --quick too: each selects what --quick leaves out for its reason.
    marked = pytester.runpytest_inprocess("-p", "tests.quick", "-m", PROCESSES, "--collect-only", "-q")
    assert {line for line in marked.stdout.lines if "::" in line} == {
        f"test_mixed.py::test_{name}"
        for name in (
            "a_process_fixture",
            "a_process_fixture_through_another",
            "a_helper_that_starts_the_trainer",
            "subprocess_imported_in_its_body",
            "marked_e2e",
            "marked_by_its_author",
        )
    }
    model = pytester.runpytest_inprocess("-p", "tests.quick", "-m", "model and not processes", "--collect-only", "-q")
    assert {line for line in model.stdout.lines if "::" in line} == {
        "test_mixed.py::test_trains_the_model",
        "test_mixed.py::test_loads_transformers",
    }


def test_the_toolings_process_starters_are_found_and_the_in_process_local_cloud_is_not() -> None:
    finder = Finder(starts_a_process)
    # By name, not `dev.start_localcloud`: a test that names a starter counts as starting processes (what it names is
    # followed, called or not), and this one starts none.
    for module, name in (
        (dev, "start_localcloud"),
        (dev, "dags_test"),
        (dev, "ensure_airflow_db"),
        (warm_cli, "start_airflow"),
    ):
        assert finder.function(getattr(module, name)), name
    assert not finder.function(running_localcloud)  # the product's package: not followed, the quick loop's wire
    assert not finder.function(test_processes_are_left_out_of_the_quick_loop_and_pure_tests_stay)
