"""How a container maps to this machine without images or namespaces: a node's fake root and PATH, an
image's local commands, mountPaths and containerPorts rewritten in what the container runs (see kubelet.py)."""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class NodeHost:
    """What a node offers its pods: its fake root (device files) and extra PATH entries (nvidia-smi)."""

    name: str
    root: Path
    path: tuple[str, ...]
    host_ip: str = "127.0.0.1"


def node_host(base: Path, name: str, labels: dict[str, str]) -> NodeHost:
    """Make the node's root: dev/vfio/0 for TPU nodes, bin/nvidia-smi for GPU nodes (as GKE's driver)."""
    root = base / name
    (root / "dev").mkdir(parents=True, exist_ok=True)
    path: tuple[str, ...] = ()
    if "cloud.google.com/gke-tpu-accelerator" in labels:
        (root / "dev" / "vfio").mkdir(exist_ok=True)
        (root / "dev" / "vfio" / "0").touch()
    gpu = labels.get("cloud.google.com/gke-accelerator")
    if gpu:
        bindir = root / "home" / "kubernetes" / "bin" / "nvidia" / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        smi = bindir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho 'GPU 0: {gpu} (UUID: GPU-localcloud-{name})'\n")
        smi.chmod(0o755)
        path = (str(bindir),)
    return NodeHost(name, root, path)


def image_commands(images: dict[str, dict[str, list[str]]], image: str) -> dict[str, list[str]]:
    for pattern, commands in images.items():
        if fnmatch.fnmatch(image, pattern):
            return {
                k: [a.replace("{python}", sys.executable).replace("{repo}", str(REPO)) for a in argv]
                for k, argv in commands.items()
            }
    return {}


def rewrite_paths(text: str, mounts: dict[str, str]) -> str:
    """Each mountPath at the start of a path (not inside a longer one) -> its host directory."""
    for mount in sorted(mounts, key=len, reverse=True):
        text = re.sub(r"(?<![\w./-])" + re.escape(mount.rstrip("/")) + r"(?=/|\b|$)", mounts[mount], text)
    return text


def rewrite_ports(argv: list[str], ports: dict[int, int]) -> list[str]:
    out: list[str] = []
    for i, arg in enumerate(argv):
        m = re.fullmatch(r"--port=(\d+)", arg)
        if m and int(m.group(1)) in ports:
            arg = f"--port={ports[int(m.group(1))]}"
        elif i > 0 and argv[i - 1] == "--port" and arg.isdigit() and int(arg) in ports:
            arg = str(ports[int(arg)])
        out.append(arg)
    return out


def expand(value: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def write_file(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)
