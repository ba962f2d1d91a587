"""Machines that start warm: every machine's workload forked from one process that already imported it.

Why: each machine of the local cloud boots a startup script that starts ``python -m interlude_workload.agent``,
and each such interpreter imported JAX, Orbax, tensorstore and the Google clients again (~1.7 CPU-s; the test
suite boots a few hundred machines: issue 44). On Google the image's Python pays that on every boot too, and the
local cloud must keep what a boot is: each machine a process group of its own, a kill of the group still a kill,
a reboot still a fresh memory. So:

* :mod:`.server` (the *zygote*) imports the workload once and forks, on request, a machine's **root**: a new
  session and process group, the machine's serial log as its output. A root is fresh on every boot (a fork of
  the zygote, not of the last boot).
* The root (:mod:`.guest`) runs the machine's startup script with bash, as before, and serves one more thing on
  a socket only its machine sees: a ``python3`` on the machine's PATH (:mod:`.shim`) asks it to fork
  ``python -m interlude_workload.agent ...`` (or ``.train``) instead of starting an interpreter. The fork is in
  the root's group, so SIGTERM and SIGKILL of the machine's group reach it as they reached the interpreter.
  Anything else (another module, a script, an environment that changes what an import did) runs the real
  interpreter.
* :mod:`.client` is the cloud's side: the zygote started once per local-cloud process, and a handle with the
  part of ``subprocess.Popen`` the machine code uses.

The workload is the same code either way; only the cost of its imports moves (``benchmarks/restore_probe.py``).
"""
