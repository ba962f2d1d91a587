"""benchmarks/suite_cpu.py: the kinds table, and a real pytest run whose child process reports its own CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.suite_cpu import OTHER, kind_of, main, sample

VENV_BIN = str(Path(sys.executable).parent)
ZYGOTE = "interlude_localcloud.forkserver.server"


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (f"{VENV_BIN}/python {VENV_BIN}/airflow dags test interlude_training --conf {{}}", "airflow dags test"),
        (f"{VENV_BIN}/python {VENV_BIN}/airflow db migrate", "airflow db migrate"),
        ("airflow dags test interlude_training --conf {}", "airflow dags test"),  # forked by the warm server
        (
            f"{VENV_BIN}/python -m interlude_dev.warm_server /tmp/interlude-warm-x/sock",
            "airflow dags test: warm server (imports once per worker)",
        ),
        ("airflow api_server -- host:127.0.0.1 port:42073", "stack: api-server"),
        (f"{VENV_BIN}/python {VENV_BIN}/airflow scheduler", "stack: scheduler"),
        (f"{VENV_BIN}/python {VENV_BIN}/airflow dag-processor", "stack: dag-processor"),
        (f"{VENV_BIN}/python {VENV_BIN}/airflow triggerer", "stack: triggerer"),
        ("[celeryd: celery@host:ForkPoolWorker-1]", "stack: celery worker"),
        ("airflow supervisor: 01a23cb0-89e5-79e5-a310-00a03903a0a1", "airflow (other: CLI calls, task supervisors)"),
        (f"{VENV_BIN}/python -m interlude_localcloud.gcs_emulator start --port 0", "local cloud: GCS emulator"),
        (f"{VENV_BIN}/python -m interlude_localcloud --port 0 --scenario s.yaml", "local cloud"),
        ("python3 -m interlude_workload.agent --bucket b --run-key k", "workload: agent"),
        (f"{VENV_BIN}/python -m interlude_workload.train --bucket b", "workload: trainer"),
        ("/usr/lib/chromium/chromium --headless", "chromium"),
        # forks of the local cloud's fork server keep its command line; their names (/proc/PID/stat) tell them apart
        (
            f"[il-zygote] {VENV_BIN}/python -m {ZYGOTE} /tmp/ilfs-1/zygote.sock",
            "local cloud: fork server (imports the workload once)",
        ),
        (
            f"[il-root] {VENV_BIN}/python -m {ZYGOTE} /tmp/ilfs-1/zygote.sock",
            "local cloud: machine roots (fork server)",
        ),
        (f"[il-agent] {VENV_BIN}/python -m {ZYGOTE} /tmp/ilfs-1/zygote.sock", "workload: agent"),
        (f"[il-train] {VENV_BIN}/python -m {ZYGOTE} /tmp/ilfs-1/zygote.sock", "workload: trainer"),
        (f"[python] {VENV_BIN}/python -m interlude_localcloud --port 0", "local cloud"),
        (
            "[pytest-xdist running] tests/faults/test_failover.py::test_x",
            "pytest (workers, collection, the tests' own code)",
        ),
        ("bash startup-script.sh", OTHER),
        (f"{VENV_BIN}/python -c print(1) /tmp/pytest-of-root/pytest-1/x", OTHER),
        (f"{VENV_BIN}/python -m pytest -q tests", "pytest (workers, collection, the tests' own code)"),
    ],
)
def test_each_process_gets_its_kind(cmdline: str, kind: str) -> None:
    assert kind_of(cmdline) == kind


def _burn(report: Path) -> str:
    """Python code that burns ~1 CPU-s, then writes its own count (user + system) to `report`."""
    return (
        "import resource, time\n"
        "end = time.process_time() + 1.0\n"
        "while time.process_time() < end: pass\n"
        "r = resource.getrusage(resource.RUSAGE_SELF)\n"
        f"open({str(report)!r}, 'w').write(str(r.ru_utime + r.ru_stime))\n"
    )


def test_a_child_process_cpu_is_seen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A test that starts a process burning ~1 CPU-s, which writes its own rusage: the table holds at least
    most of it under that process's kind."""
    report = tmp_path / "self.txt"
    burn = _burn(report)
    target = tmp_path / "test_burn.py"
    target.write_text(
        f"import subprocess, sys\ndef test_burn():\n    subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n"
    )
    assert main(["--json", "--interval", "0.1", "--", "-q", "-p", "no:cacheprovider", str(target)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    own = float(report.read_text())
    assert own >= 0.9
    seen = sum(r["cpu_seconds"] for r in out["rows"] if r["kind"] == OTHER)
    assert 0.7 * own <= seen <= own + 0.1, (seen, own, out)
    assert any(r["kind"].startswith("pytest") and r["cpu_seconds"] > 0 for r in out["rows"])


def test_by_test_puts_a_child_process_cpu_on_the_test_that_started_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two tests: one starts a process that burns ~1 CPU-s and writes its own rusage, one does nothing. --by-test
    gives the first at least most of that process's count and the second next to none."""
    report = tmp_path / "self.txt"
    burn = _burn(report)
    target = tmp_path / "test_two.py"
    target.write_text(
        "import subprocess, sys\n"
        f"def test_burn():\n    subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n"
        "def test_idle():\n    pass\n"
    )
    assert main(["--json", "--by-test", "5", "--", "-q", "-p", "no:cacheprovider", str(target)]) == 0
    tests = {
        t["test"].split("::")[-1]: t for t in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tests"]
    }
    own = float(report.read_text())
    assert own >= 0.9
    assert set(tests) == {"test_burn", "test_idle"}, tests
    assert own * 0.9 <= tests["test_burn"]["reaped"] <= tests["test_burn"]["cpu"], tests["test_burn"]
    assert tests["test_idle"]["cpu"] < 0.3, tests["test_idle"]


def test_a_process_that_exited_unreaped_keeps_the_kind_it_had_while_it_lived() -> None:
    """A sample can fall between a process's exit and its parent's wait: a zombie's command line is empty, and the
    process must keep the kind read while it lived (in CI the suite's own pytest, a zombie at the last sample,
    was counted as "other")."""
    marker = "interlude_suite_cpu_zombie"
    child = subprocess.Popen([sys.executable, "-c", f"import sys; sys.stdin.read()  # {marker}"], stdin=subprocess.PIPE)
    try:
        seen: dict[int, tuple[str, float]] = {}
        while marker not in seen.get(child.pid, ("", 0.0))[0]:  # until the exec is done
            sample(child.pid, seen)
        child.stdin.close()  # type: ignore[union-attr]
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)
        sample(child.pid, seen)
        assert marker in seen[child.pid][0] and kind_of(seen[child.pid][0]) == OTHER
    finally:
        child.wait()
