"""interlude_dev.apt: processes that find the same package missing at once install it once, one apt-get at a time.

A stand-in `apt-get` first on PATH (a real install would change this machine and need a mirror): it logs when each
call starts and ends, sleeps, and "installs" a package by creating a file the presence check looks for. The
callers are real separate processes, started together.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from interlude_dev import apt

FAKE_APT_GET = """#!/bin/sh
echo "start $$ $*" >> "$APT_LOG"
sleep 0.4
case " $* " in *" install "*) for pkg in "$@"; do :; done; touch "$PKG_DIR/$pkg" ;; esac
echo "end $$" >> "$APT_LOG"
"""

CALLER = """
import sys
from pathlib import Path
from interlude_dev import apt
apt.ensure({"pkg-a": (Path(sys.argv[1]) / "pkg-a").exists})
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="apt.ensure runs apt-get only as root")
def test_three_processes_missing_one_package_install_it_once_never_two_apt_gets_at_once(tmp_path: Path) -> None:
    bin_dir, pkg_dir, log = tmp_path / "bin", tmp_path / "pkgs", tmp_path / "apt.log"
    bin_dir.mkdir()
    pkg_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT_GET)
    (bin_dir / "apt-get").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "APT_LOG": str(log),
        "PKG_DIR": str(pkg_dir),
        "INTERLUDE_APT_LOCK": str(tmp_path / "apt.lock"),
    }
    callers = [subprocess.Popen([sys.executable, "-c", CALLER, str(pkg_dir)], env=env) for _ in range(3)]
    assert [c.wait(timeout=60) for c in callers] == [0, 0, 0]

    lines = log.read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == ["start", "end", "start", "end"], lines  # one at a time
    assert ["update" in lines[0], "install" in lines[2]] == [True, True], lines
    assert "--no-install-recommends pkg-a" in lines[2]
    assert "DPkg::Lock::Timeout=600" in lines[0]  # apt waits for other apt users as well
    assert (pkg_dir / "pkg-a").exists()


def test_nothing_missing_needs_no_apt_get_and_missing_without_it_names_the_packages(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", str(tmp_path))  # no apt-get anywhere
        apt.ensure({"present": lambda: True})  # nothing missing: returns without looking for apt-get
        with pytest.raises(apt.CannotInstall, match=r"missing \['absent'\]"):
            apt.ensure({"absent": lambda: False, "present": lambda: True})
