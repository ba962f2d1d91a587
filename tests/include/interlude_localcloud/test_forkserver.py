"""The fork server keeps what a machine is (include/interlude_localcloud/forkserver): the workload a fork in the
machine's own process group, SIGTERM and SIGKILL of the group reaching it, its exit code reaching the startup
script, and the same serial log as an interpreter started the usual way; anything it cannot fork faithfully runs
the real interpreter."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from interlude_localcloud.forkserver import wire
from interlude_localcloud.forkserver.client import ENABLE_ENV, ForkServer
from interlude_localcloud.forkserver.guest import Imports
from interlude_localcloud.machines import MachineProcess

# The agent against a GCS that refuses every connection: it says so and retries until SIGTERM, then stops (exit 0).
SCRIPT = """#!/bin/bash
python3 -m interlude_workload.agent --no-such-flag 2>/dev/null; echo "marker: bad flag exited $?"
python3 -c 'import sys; print("marker: plain python", sys.flags.isolated)'
python3 -m interlude_workload.agent --bucket b --run-key k --idle-poll 0.2 &
child=$!
trap 'kill -TERM $child' TERM
wait $child; rc=$?
while kill -0 $child 2>/dev/null; do wait $child; rc=$?; done
echo "marker: agent exited $rc"
"""
ENV = {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:1", "INTERLUDE_METADATA_URL": "http://127.0.0.1:1/computeMetadata/v1"}


def _group(pgid: int) -> dict[int, str]:
    """pid -> name of every live process in a process group (zombies are dead)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm, rest = (entry / "stat").read_text().split("(", 1)[1].rsplit(")", 1)
            except OSError:
                continue
            fields = rest.split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out[int(entry.name)] = comm
    return out


def _wait_for(log: Path, text: str, machine: MachineProcess) -> None:
    deadline = time.monotonic() + 300
    while text not in log.read_text(errors="replace"):
        assert machine.running() and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.05)


def _wait_for_count(log: Path, text: str, count: int, machine: MachineProcess) -> None:
    deadline = time.monotonic() + 300
    while log.read_text(errors="replace").count(text) < count:
        assert machine.running() and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.05)


def _markers(log: Path) -> list[str]:
    lines = log.read_text(errors="replace").splitlines()
    keep = ("marker:", "agent: error #1 ", "agent: stopping")
    return [ln.split(" (", 1)[0] if ln.startswith("agent: error") else ln for ln in lines if ln.startswith(keep)]


@pytest.fixture
def zygote(monkeypatch: pytest.MonkeyPatch) -> ForkServer:
    monkeypatch.setenv(ENABLE_ENV, "1")
    server = ForkServer.wait_shared()
    assert server is not None, "the fork server did not start"
    return server


def _boot(tmp_path: Path, name: str) -> MachineProcess:
    machine = MachineProcess(name, tmp_path / name, {"INTERLUDE_MACHINE_ID": name, **ENV})
    machine.boot(SCRIPT)
    return machine


@pytest.mark.processes  # its machines run the agent (tests/quick.py cannot see that in data)
def test_a_forked_boot_logs_what_an_interpreter_would_and_its_group_is_the_machine(
    zygote: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forked = _boot(tmp_path, "forked")
    _wait_for(forked.serial_log, "agent: error #1", forked)
    root = forked.pid()
    assert root is not None
    names = sorted(_group(root).values())
    assert "il-agent" in names and "il-root" in names and "bash" in names, names  # the agent forked, in the group
    forked.shutdown(grace=60, reason="test", block=True)  # SIGTERM to the group, as maintenance would
    assert _group(root) == {}

    monkeypatch.setenv(ENABLE_ENV, "0")
    cold = _boot(tmp_path, "cold")
    _wait_for(cold.serial_log, "agent: error #1", cold)
    cold_root = cold.pid()
    assert cold_root is not None and "il-agent" not in _group(cold_root).values()
    cold.shutdown(grace=60, reason="test", block=True)

    expected = [
        "marker: bad flag exited 2",
        "marker: plain python 0",  # anything else: the real interpreter, not isolated
        "agent: error #1",
        "agent: stopping",
        "marker: agent exited 0",
    ]
    assert _markers(cold.serial_log) == expected, cold.serial_log.read_text()[-3000:]
    assert _markers(forked.serial_log) == expected, forked.serial_log.read_text()[-3000:]


@pytest.mark.processes
def test_a_crash_kills_every_process_of_the_forked_machine_and_a_reboot_is_a_new_root(
    zygote: ForkServer, tmp_path: Path
) -> None:
    machine = _boot(tmp_path, "crashing")
    _wait_for(machine.serial_log, "agent: error #1", machine)
    root = machine.pid()
    assert root is not None and "il-agent" in _group(root).values()
    machine.crash()  # SIGKILL of the group: no agent may live on in the zygote's care
    assert _group(root) == {} and not machine.running()
    machine.boot(SCRIPT)
    _wait_for_count(machine.serial_log, "agent: error #1 ", 2, machine)  # the second boot's agent is up
    again = machine.pid()
    assert again is not None and again != root and "il-agent" in _group(again).values()
    machine.destroy()


def test_only_what_the_zygote_imported_under_the_same_import_time_environment_is_forked() -> None:
    emu = {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}
    imports = Imports(
        before={"PATH": "/a", "JAX_PLATFORMS": "cpu"},
        after={"PATH": "/a", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--x", "TENSORSTORE_GCS_HTTP_URL": "http://p"},
        derived=frozenset({"TENSORSTORE_GCS_HTTP_URL", "STORAGE_EMULATOR_HOST"}),
    )
    assert wire.module_of(["-m", "interlude_workload.agent", "--bucket", "b"]) == "interlude_workload.agent"
    assert wire.module_of(["-m", "interlude_workload.train"]) == "interlude_workload.train"
    for other in (["-m", "json.tool"], ["-c", "print(1)"], ["script.py"], ["-u", "-m", "interlude_workload.agent"]):
        assert wire.module_of(other) is None, other
    assert imports.compatible({**emu, "PATH": "/b", "JAX_PLATFORMS": "cpu", "INTERLUDE_MACHINE_ID": "m"})
    assert imports.compatible({**emu, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--x"})  # as the imports left it
    # the emulator's settings are derived again in each fork from its own endpoint: any value is fine
    assert imports.compatible({**emu, "JAX_PLATFORMS": "cpu", "TENSORSTORE_GCS_HTTP_URL": "http://127.0.0.1:7"})
    assert not imports.compatible({"JAX_PLATFORMS": "cpu"})  # real GCS: gcsfs and google-auth import otherwise
    assert not imports.compatible({**emu, "JAX_PLATFORMS": "tpu"})  # JAX would have imported for another platform
    assert not imports.compatible({**emu, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--y"})
    assert not imports.compatible({**emu, "JAX_PLATFORMS": "cpu", "PYTHONPATH": "/site"})  # another sitecustomize
    assert not imports.compatible(emu)  # JAX_PLATFORMS unset: JAX would choose its platform itself
    # the environment a fork gets: the request's, with what the imports set where it had the value from before
    got = imports.environ({**emu, "JAX_PLATFORMS": "cpu", "HOME": "/h"})
    assert got == {**emu, "JAX_PLATFORMS": "cpu", "HOME": "/h", "XLA_FLAGS": "--x"}


def test_a_zygote_over_its_cpu_budget_is_stopped_and_machines_start_cold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote's start is bounded by its own CPU, not a wall clock a loaded machine stretches: over its budget
    (here a tenth of a CPU-second, less than its imports) it is stopped and the error says so (the shared path
    then boots machines cold, as with it off: ForkServer._start_shared)."""
    from interlude_localcloud.forkserver import client

    monkeypatch.setattr(client, "START_CPU_SECONDS", 0.1)
    monkeypatch.setenv(ENABLE_ENV, "1")
    with pytest.raises(RuntimeError, match=r"fork server did not start \(\d+ CPU-s of its own\)"):
        ForkServer()
    assert client.START_TIMEOUT >= 600, "the wall bound is for a zygote that gets nowhere"
