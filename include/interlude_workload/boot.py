"""Which boot of the machine this is, and when it started: what progress.json says to the control plane.

Apart from the SDK so that the machine's agent (its heartbeat) can say it without importing Orbax.
"""

from __future__ import annotations

import os
import time

from interlude_workload.stage_files import log_writer_id

BOOT_ID_ENV = "INTERLUDE_BOOT_ID"
BOOT_STARTED_ENV = "INTERLUDE_BOOT_STARTED_AT"
KERNEL_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """Something that changes on every boot of the machine and only then.

    The startup script (run once per boot) exports it; on a real VM it is the kernel's boot id
    (https://man7.org/linux/man-pages/man4/random.4.html); without either, this process's id, which at
    least changes with every start of the workload.
    """
    value = os.environ.get(BOOT_ID_ENV, "").strip()
    if value:
        return value
    try:
        with open(KERNEL_BOOT_ID) as f:
            return f.read().strip() or log_writer_id()
    except OSError:
        return log_writer_id()


def boot_started_at() -> float:
    """When this boot started (epoch seconds): from the startup script, else the kernel's uptime."""
    try:
        return float(os.environ[BOOT_STARTED_ENV])
    except (KeyError, ValueError):
        pass
    try:
        with open("/proc/uptime") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()
