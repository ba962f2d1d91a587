"""A kubelet for one pod: its containers run as local processes, each in its own process group (as the
machines' startup scripts do), with the pod's volumes as directories and its containerPorts on one loopback port.

How a container maps to this machine (a container runtime's job on GKE, done here without namespaces):
- the image picks local commands (scenario `gke.images`: image glob -> {name: argv}); they are put as shims
  on the container's PATH, so `vllm serve ...` or `python3 script.py` run the local equivalent;
- each volume (emptyDir, configMap, projected token + CA, hostPath) is a directory; a mountPath written in
  the command, args, env or a configMap file is rewritten to that directory;
- the pod gets one loopback port; `--port=N`/`--port N` for a declared containerPort N becomes it, and the
  probes of port N go to it (all containers of a pod share one network namespace on Kubernetes too);
- the node's accelerator shows the way the entrypoint scripts look for it: `INTERLUDE_DEVICE_ROOT` is the
  node's root (with `dev/vfio/0` on TPU nodes), and GPU nodes have an `nvidia-smi` on PATH.
Probes (httpGet) run every min(periodSeconds, 1) real seconds; a container whose liveness probe fails
failureThreshold times in a row, or that exits, is restarted (restartPolicy Always; OnFailure restarts only
a non-zero exit, Never none); once every container exited for good the pod is Succeeded (all exit codes 0) or
Failed (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#restart-policy).
Deletion: SIGTERM to the process group, SIGKILL after the grace period
(https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from interlude_localcloud.forkserver.client import Forked, ForkServer
from interlude_localcloud.gke import gcsfuse
from interlude_localcloud.gke.containers import (
    NodeHost,
    expand,
    image_commands,
    rewrite_paths,
    rewrite_ports,
    write_file,
)
from interlude_localcloud.gke.loopback import loopback_session
from interlude_localcloud.gke.pod_status import restarts_after, terminated, transitions
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store, now

PODS = next(r for r in RESOURCES if r.plural == "pods")
CONFIGMAPS = next(r for r in RESOURCES if r.plural == "configmaps")
MAX_GRACE_SECONDS = 10.0
MAX_PRESTOP_SECONDS = 1.0  # the local cluster's Service ports drop a pod at once: a second outlasts any connect


@dataclass(frozen=True)
class PodEnv:
    store: Store
    images: dict[str, dict[str, list[str]]]
    kube_port: int
    ca_pem: bytes
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes] | Forked | None = None
    restarts: int = 0
    ready: bool = False
    live_failures: int = 0
    ever_ready: bool = False
    exit_code: int | None = None  # exited for good (restartPolicy Never, or OnFailure after a success)


class PodRunner:
    """Runs one bound pod until stopped; writes its status (phase, conditions, containerStatuses)."""

    def __init__(self, env: PodEnv, pod: dict[str, Any], node: NodeHost, pod_dir: Path, port: int) -> None:
        self.env, self.pod, self.node, self.dir, self.port = env, pod, node, pod_dir, port
        self.ns, self.name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        spec = pod.get("spec") or {}
        self.spec = spec
        self.ports = {int(p["containerPort"]): port for c in spec.get("containers") or [] for p in c.get("ports") or []}
        self.named_ports = {
            p["name"]: int(p["containerPort"])
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if p.get("name")
        }
        self.procs = {c["name"]: _Proc(c["name"]) for c in spec.get("containers") or []}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"kubelet-{self.name}", daemon=True)
        self._http = loopback_session()  # probes run in _thread only
        self.mounts: dict[str, str] = {}
        self.phase = "Pending"
        self._written: Any = None
        self.spawned: list[int] = []  # every process group leader started, init containers and restarts too
        self.pumps: list[threading.Thread] = []  # output readers: the log is complete once they are done

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread.start()

    def pids(self) -> list[int]:
        with self._lock:
            return [p.popen.pid for p in self.procs.values() if p.popen is not None and p.popen.poll() is None]

    def all_pids(self) -> list[int]:
        with self._lock:
            return list(self.spawned)

    def ready(self) -> bool:
        with self._lock:
            return self.phase == "Running" and all(p.ready for p in self.procs.values())

    def _prestop_sleep(self) -> float:
        """The longest `lifecycle.preStop.sleep.seconds` of the pod's containers (they run in parallel)."""
        hooks = [((c.get("lifecycle") or {}).get("preStop") or {}) for c in self.spec.get("containers") or []]
        return max((float((h.get("sleep") or {}).get("seconds") or 0) for h in hooks), default=0.0)

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM every container's process group, SIGKILL what is left after the grace period."""
        self._stop.set()
        if grace is None:
            grace = min(float(self.spec.get("terminationGracePeriodSeconds", 30)), MAX_GRACE_SECONDS)
        deadline = time.monotonic() + grace
        # preStop sleep hooks first, inside the grace period, as the kubelet runs them before SIGTERM.
        pause = min(self._prestop_sleep(), MAX_PRESTOP_SECONDS, grace)
        if pause > 0:
            time.sleep(pause)
        with self._lock:
            procs = [p.popen for p in self.procs.values() if p.popen is not None]
        for popen in procs:
            _signal_group(popen, signal.SIGTERM)
        for popen in procs:
            try:
                popen.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        for popen in procs:
            _signal_group(popen, signal.SIGKILL)  # the whole group: children left behind go too
            try:
                popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._thread.join(timeout=grace + 5)
        for pump in list(self.pumps):  # the last lines a terminating container wrote, then the log is over
            pump.join(timeout=5)
        self.env.store.end_log(self.ns, self.name)

    # ------------------------------------------------------------------ setup
    def _volumes(self) -> None:
        """Each volume a directory, each mountPath mapped to it; then the files (paths in them rewritten)."""
        for vol in self.spec.get("volumes") or []:
            d = self.dir / "volumes" / vol["name"]
            if "hostPath" in vol:
                d = self.node.root / vol["hostPath"]["path"].lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            self.mounts_by_volume[vol["name"]] = str(d)
        for c in (self.spec.get("initContainers") or []) + (self.spec.get("containers") or []):
            for m in c.get("volumeMounts") or []:
                if m["name"] in self.mounts_by_volume:
                    self.mounts[m["mountPath"]] = self.mounts_by_volume[m["name"]]
        for vol in self.spec.get("volumes") or []:
            self._fill(Path(self.mounts_by_volume[vol["name"]]), vol)

    def _fill(self, d: Path, vol: dict[str, Any]) -> None:
        if "configMap" in vol:
            cm = vol["configMap"]
            self._write_config_map(d, cm["name"], cm.get("items"), int(cm.get("defaultMode", 0o644)))
        projected = vol.get("projected") or {}
        mode = int(projected.get("defaultMode", 0o644))
        for src in projected.get("sources") or []:
            if "serviceAccountToken" in src:  # any bearer token is accepted by the local API server
                write_file(d / src["serviceAccountToken"].get("path", "token"), "localcloud-pod-token", mode)
            if "configMap" in src:
                self._write_config_map(d, src["configMap"]["name"], src["configMap"].get("items"), mode)
        if gcsfuse.is_gcsfuse(vol):  # the GCS FUSE CSI driver: the bucket's objects appear under the mount
            gcsfuse.mount(d, vol, self.pod, self.env.extra_env.get("STORAGE_EMULATOR_HOST"))

    mounts_by_volume: dict[str, str]

    def _write_config_map(self, d: Path, name: str, items: list[dict[str, Any]] | None, mode: int) -> None:
        if name == "kube-root-ca.crt":  # published in every namespace by the API server
            data = {"ca.crt": self.env.ca_pem.decode()}
        else:
            try:
                data = dict(self.env.store.get(CONFIGMAPS, self.ns, name).get("data") or {})
            except KubeError:
                data = {}
        paths = {i["key"]: i.get("path", i["key"]) for i in items} if items else {k: k for k in data}
        for key, path in paths.items():
            if key in data:
                write_file(d / path, rewrite_paths(data[key], self.mounts), mode)

    def _container_env(self, c: dict[str, Any]) -> dict[str, str]:
        env = {
            "PATH": "",
            "HOME": str(self.dir),
            "HOSTNAME": self.spec.get("hostname") or self.name,
            "LANG": "C.UTF-8",
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.env.kube_port),
            "INTERLUDE_DEVICE_ROOT": str(self.node.root),
            **self.env.extra_env,
        }
        fields = {
            "spec.nodeName": self.node.name,
            "status.hostIP": self.node.host_ip,
            "status.podIP": "127.0.0.1",
            "metadata.name": self.name,
            "metadata.namespace": self.ns,
            "metadata.uid": str(self.pod["metadata"].get("uid") or ""),
            **{
                f"metadata.{kind}['{k}']": str(v)
                for kind in ("labels", "annotations")
                for k, v in (self.pod["metadata"].get(kind) or {}).items()
            },
        }
        for item in c.get("env") or []:
            ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            value = fields.get(ref, "") if ref else expand(str(item.get("value", "")), env)
            env[item["name"]] = rewrite_paths(value, self.mounts)
        env.update(gcsfuse.mounts_env(c, self.mounts_by_volume))
        bindir = self.dir / "bin" / c["name"]
        bindir.mkdir(parents=True, exist_ok=True)
        for cmd, argv in image_commands(self.env.images, c.get("image", "")).items():
            write_file(bindir / cmd, "#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"\n', 0o755)
        env["PATH"] = os.pathsep.join([str(bindir), *self.node.path, "/usr/local/bin", "/usr/bin", "/bin"])
        return env

    def _spawn(self, c: dict[str, Any]) -> subprocess.Popen[bytes] | Forked:
        env = self._container_env(c)
        argv = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
        argv = rewrite_ports([rewrite_paths(a, self.mounts) for a in argv], self.ports)
        popen = self._forked(c, argv, env)
        if popen is None:
            if argv and "/" not in argv[0]:
                for d in env["PATH"].split(os.pathsep):
                    if os.access(os.path.join(d, argv[0]), os.X_OK):
                        argv[0] = os.path.join(d, argv[0])
                        break
            popen = subprocess.Popen(
                argv,
                cwd=self.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.spawned.append(popen.pid)
        pump = threading.Thread(target=self._pump, args=(popen, c["name"]), daemon=True)
        self.pumps.append(pump)
        pump.start()
        return popen

    def _forked(self, c: dict[str, Any], argv: list[str], env: dict[str, str]) -> Forked | None:
        """``python -m interlude_workload.agent ...`` where the image's ``python`` is this interpreter: a fork of
        the local cloud's fork server (its own session and group, as a container's process; forkserver/), else
        None (the command runs as it is)."""
        python = image_commands(self.env.images, c.get("image", "")).get(argv[0] if argv else "")
        zygote = ForkServer.shared() if python == [sys.executable] else None
        if zygote is None:
            return None
        try:
            return zygote.module(argv[1:], str(self.dir), env)
        except (OSError, EOFError, KeyError, ValueError):
            return None  # it went away: the command runs as it is

    def _pump(self, popen: subprocess.Popen[bytes] | Forked, container: str) -> None:
        assert popen.stdout is not None
        with open(self.dir / f"{container}.log", "ab") as f:
            for raw in popen.stdout:
                f.write(raw)
                f.flush()
                self.env.store.append_log(self.ns, self.name, raw.decode(errors="replace").rstrip("\n"))

    # ------------------------------------------------------------------ run
    def _run(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.mounts_by_volume = {}
            self._volumes()
            if not self._init_containers():
                return
            with self._lock:
                self.phase = "Running"
            self._loop()
        except Exception as e:  # noqa: BLE001 - a broken pod must not take the cluster's loop down
            self.env.store.append_log(self.ns, self.name, f"kubelet: {e!r}")
            with self._lock:
                self.phase = "Failed"
            self._write_status()

    def _init_containers(self) -> bool:
        for c in self.spec.get("initContainers") or []:
            while not self._stop.is_set():
                with self._lock:
                    if self._stop.is_set():  # stop() may have collected the processes already
                        return False
                    popen = self._spawn(c)
                    self.procs.setdefault("init:" + c["name"], _Proc(c["name"])).popen = popen
                while popen.poll() is None and not self._stop.is_set():
                    time.sleep(0.1)
                with self._lock:
                    self.procs.pop("init:" + c["name"], None)
                if popen.returncode == 0:
                    break
                self._stop.wait(1.0)
        return not self._stop.is_set()

    def _loop(self) -> None:
        containers = {c["name"]: c for c in self.spec.get("containers") or []}
        while not self._stop.is_set():
            for name, c in containers.items():
                self._tend(self.procs[name], c)
            codes = [p.exit_code for n, p in self.procs.items() if n in containers]
            if codes and all(code is not None for code in codes):
                with self._lock:
                    self.phase = "Succeeded" if not any(codes) else "Failed"
                self._write_status()
                return
            self._write_status()
            self._stop.wait(min([_period(c) for c in containers.values()] + [1.0]))

    def _tend(self, proc: _Proc, c: dict[str, Any]) -> None:
        if proc.popen is None or proc.popen.poll() is not None:
            if proc.popen is not None:
                code = proc.popen.returncode
                code = 128 - code if code < 0 else code  # killed by signal N: exit code 128 + N, as runtimes report
                if proc.exit_code is not None or not restarts_after(self.spec, code):
                    proc.exit_code = code
                    return
                proc.restarts += 1
            with self._lock:
                if self._stop.is_set():
                    return
                proc.popen, proc.ready, proc.ever_ready, proc.live_failures = self._spawn(c), False, False, 0
            return
        proc.ready = self._probe(c.get("readinessProbe"))
        proc.ever_ready = proc.ever_ready or proc.ready
        live = c.get("livenessProbe")
        if live and proc.ever_ready:
            proc.live_failures = 0 if self._probe(live) else proc.live_failures + 1
            if proc.live_failures >= int(live.get("failureThreshold", 3)):
                self.env.store.append_log(self.ns, self.name, f"kubelet: liveness probe failed; restarting {c['name']}")
                _signal_group(proc.popen, signal.SIGKILL)
                proc.popen.wait()

    def _probe(self, probe: dict[str, Any] | None) -> bool:
        if not probe:
            return True
        get = probe.get("httpGet")
        if not get:
            return True
        port = get.get("port")
        port = self.named_ports.get(port, port) if isinstance(port, str) else int(port)
        local = self.ports.get(int(port), int(port))
        try:
            r = self._http.get(
                f"http://127.0.0.1:{local}{get.get('path', '/')}", timeout=float(probe.get("timeoutSeconds", 1))
            )
            return 200 <= r.status_code < 400
        except requests.RequestException:
            return False

    def _write_status(self) -> None:
        with self._lock:
            statuses = [
                {
                    "name": n,
                    "ready": p.ready,
                    "restartCount": p.restarts,
                    "image": next(
                        (c.get("image", "") for c in self.spec.get("containers") or [] if c["name"] == n), ""
                    ),
                    "imageID": "",
                    "started": p.popen is not None,
                    "state": {"running": {}}
                    if p.popen is not None and p.popen.poll() is None
                    else terminated(p.exit_code)
                    if p.exit_code is not None
                    else {"waiting": {"reason": "ContainerCreating"}},
                }
                for n, p in self.procs.items()
                if not n.startswith("init:")
            ]
            ready = self.phase == "Running" and all(s["ready"] for s in statuses)
            phase = self.phase
        key = (phase, ready, tuple((s["ready"], s["restartCount"], str(s["state"])) for s in statuses))
        if key == self._written:
            return
        flag = "True" if ready else "False"
        status = {
            "phase": phase,
            "hostIP": self.node.host_ip,
            "podIP": "127.0.0.1",
            "startTime": now(),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True" if phase == "Running" else "False"},
                {"type": "ContainersReady", "status": flag},
                {"type": "Ready", "status": flag},
            ],
            "containerStatuses": statuses,
        }

        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            cur["status"] = transitions(cur.get("status") or {}, status)
            cur["metadata"].pop("resourceVersion", None)
            return cur

        try:
            self.env.store.update(PODS, self.ns, self.name, mutate, "status")
            self._written = key
        except KubeError:
            pass


def _period(c: dict[str, Any]) -> float:
    return min(float((c.get("readinessProbe") or {}).get("periodSeconds", 1)), 1.0)


def _signal_group(popen: subprocess.Popen[bytes] | Forked, sig: signal.Signals) -> None:
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
