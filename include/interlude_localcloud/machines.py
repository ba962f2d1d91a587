"""Machine processes: a booted TPU node or GCE VM runs its startup-script as a local bash process.

Each machine has a disk dir under the state dir (kept across reboots, removed on delete); the script
runs there in its own process group with stdout/stderr appended to `serial.log`, so going down for
maintenance can signal the whole group (SIGTERM, SIGKILL after a grace) the way a host shutdown would.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlude_localcloud.forkserver.client import Forked, ForkServer


@dataclass(frozen=True)
class Devices:
    """The accelerators a machine's guest sees, the way the entrypoints look for them (as on the local GKE's
    nodes, gke/containers.py): `$INTERLUDE_DEVICE_ROOT/dev/vfio/N` per TPU chip (TPU VMs expose their chips
    through VFIO), and for NVIDIA GPUs an `nvidia-smi` on PATH that lists them (as the driver installs it)."""

    tpu_chips: int = 0
    gpu: str = ""
    gpu_count: int = 0

    def make(self, root: Path, machine_id: str) -> tuple[dict[str, str], str]:
        """Create the fake root under `root`: (env additions, a directory to put first on PATH or "")."""
        (root / "dev").mkdir(parents=True, exist_ok=True)
        for chip in range(self.tpu_chips):
            (root / "dev" / "vfio").mkdir(exist_ok=True)
            (root / "dev" / "vfio" / str(chip)).touch()
        bindir = ""
        if self.gpu:
            bin_path = root / "usr" / "bin"
            bin_path.mkdir(parents=True, exist_ok=True)
            lines = "".join(
                f"echo 'GPU {i}: {self.gpu} (UUID: GPU-localcloud-{machine_id}-{i})'\n" for i in range(self.gpu_count)
            )
            smi = bin_path / "nvidia-smi"
            smi.write_text(f"#!/bin/sh\n{lines}")
            smi.chmod(0o755)
            bindir = str(bin_path)
        return {"INTERLUDE_DEVICE_ROOT": str(root)}, bindir


class MachineProcess:
    """The guest side of one machine: its disk dir and, while booted, its startup-script process."""

    def __init__(self, machine_id: str, disk_dir: Path, env: dict[str, str], devices: Devices | None = None) -> None:
        self.machine_id = machine_id
        self.disk_dir = disk_dir
        self.env = env
        self.devices = devices
        self._proc: subprocess.Popen[bytes] | Forked | None = None
        self._lock = threading.Lock()
        self.boots = 0

    @property
    def serial_log(self) -> Path:
        return self.disk_dir / "serial.log"

    def _log(self, line: str) -> None:
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        with self.serial_log.open("a") as f:
            f.write(f"[localcloud {time.strftime('%H:%M:%S')}] {line}\n")

    def boot(self, script: str | None) -> None:
        """Start the startup script (a machine with no script just boots)."""
        with self._lock:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            self.boots += 1
            self._log(f"boot #{self.boots}")
            if not script or (self._proc is not None and self._proc.poll() is None):
                return
            path = self.disk_dir / ".startup-script"
            path.write_text(script)
            env = dict(os.environ)
            env.update(self.env)
            env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
            if self.devices is not None:
                extra, bindir = self.devices.make(self.disk_dir / "root", self.machine_id)
                env.update(extra)
                if bindir:
                    env["PATH"] = bindir + os.pathsep + env["PATH"]
            log = self.serial_log.open("ab")
            try:
                self._proc = _forked_root(str(path), str(self.disk_dir), env, log.fileno())
                if self._proc is None:
                    self._proc = subprocess.Popen(
                        ["bash", str(path)],
                        cwd=self.disk_dir,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
            finally:
                log.close()

    def running(self) -> bool:
        with self._lock:
            return self._proc is not None and self._proc.poll() is None

    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def shutdown(self, grace: float, reason: str, block: bool = False) -> None:
        """SIGTERM the process group, SIGKILL after `grace` seconds (in a thread unless block)."""
        with self._lock:
            proc, self._proc = self._proc, None
            self._log(f"shutdown ({reason})")
        if proc is None:
            return

        def stop() -> None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            else:
                _signal_group(proc, signal.SIGKILL)  # stragglers left in the group

        if block:
            stop()
        else:
            threading.Thread(target=stop, name=f"stop-{self.machine_id}", daemon=True).start()

    def crash(self) -> None:
        """SIGKILL the process group, as a kernel panic or host crash would."""
        with self._lock:
            proc, self._proc = self._proc, None
            self._log("crash (SIGKILL)")
        if proc is not None:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()

    def destroy(self) -> None:
        """Kill everything and remove the disk (machine deleted)."""
        self.crash()
        shutil.rmtree(self.disk_dir, ignore_errors=True)


def _forked_root(script: str, cwd: str, env: dict[str, str], log_fd: int) -> Forked | None:
    """The machine's root forked by the fork server, which imported the workload once (forkserver/); None when
    there is none serving (the script then runs as a new process)."""
    zygote = ForkServer.shared()
    if zygote is None:
        return None
    try:
        return zygote.machine(script, cwd, env, log_fd)
    except (OSError, EOFError, KeyError, ValueError):
        return None  # it went away: boot the way a machine always could


def _signal_group(proc: subprocess.Popen[bytes] | Forked, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class MachineTable(dict[tuple[str, str, str], Any]):
    """The cloud's table of machines ((kind, zone, name) -> Machine) that also keeps when each entry came and
    went: a machine is in the table from its create request (a create that fails included, while it is
    listed) to its deletion, so these lifetimes are the cloud's own record of how many machines were alive at
    once, with no sampling. Times are `time.time()`, the clock of the event log."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.lifetimes: list[dict[str, Any]] = []
        self._open: dict[tuple[str, str, str], dict[str, Any]] = {}
        for key in self:
            self._enter(key)

    def _enter(self, key: tuple[str, str, str]) -> None:
        kind, zone, name = key
        entry = {"id": f"{kind}-{zone}-{name}", "kind": kind, "zone": zone, "name": name}
        self._open[key] = {**entry, "created": time.time(), "deleted": None}
        self.lifetimes.append(self._open[key])

    def _leave(self, key: tuple[str, str, str]) -> None:
        entry = self._open.pop(key, None)
        if entry is not None:
            entry["deleted"] = time.time()

    def __setitem__(self, key: tuple[str, str, str], value: Any) -> None:
        if self.get(key) is not value:
            self._leave(key)
            self._enter(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: tuple[str, str, str]) -> None:
        super().__delitem__(key)
        self._leave(key)

    def pop(self, key: tuple[str, str, str], *default: Any) -> Any:
        if key in self:
            self._leave(key)
        return super().pop(key, *default)

    def since(self, t: float) -> list[dict[str, Any]]:
        """Lifetimes of machines alive at or after `t` (copies)."""
        return [dict(e) for e in self.lifetimes if e["deleted"] is None or e["deleted"] >= t]
