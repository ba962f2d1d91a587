"""TensorFlow TPU runtime names: parse Google's ``tpu-vm-tf-*`` names and tell which TPUs each fits.

Google's grammar (https://cloud.google.com/tpu/docs/runtimes) is ``tpu-vm-tf-X.Y.Z[-pod][-{pjrt|se}]``;
hardware suffixes are the exception: TPU v4 used ``-v4`` names up to TF 2.10.0, and zones also list
2.18.0 builds named for the hardware (``tpu-vm-tf-2.18.0-pjrt-v5e-and-v6``, ``-pjrt-v5p-and-below``).
A name is judged by these rules; whether it exists is the zone's list (or, without one, Google's
published releases).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import Version

from interlude.runtimes.table import RuntimeTable, TpuGeneration

_NAME = re.compile(
    r"^tpu-vm-tf-(?P<version>\d+\.\d+\.\d+)(?P<pod>-pod)?(?:-(?P<api>pjrt|se))?"
    r"(?:-(?P<hardware>v4|v5e-and-v6|v5p-and-below))?$"
)
GRAMMAR = "tpu-vm-tf-X.Y.Z[-pod][-pjrt|-se][-v4|-v5e-and-v6|-v5p-and-below]"


@dataclass(frozen=True)
class TfRuntime:
    """A parsed TensorFlow runtime name."""

    name: str
    version: Version
    pod: bool
    api: str  # "pjrt" | "se" | ""
    hardware: str  # "v4" | "v5e-and-v6" | "v5p-and-below" | ""


def parse_tf_runtime(name: str) -> TfRuntime | None:
    m = _NAME.match(name)
    if m is None:
        return None
    return TfRuntime(
        name=name,
        version=Version(m.group("version")),
        pod=bool(m.group("pod")),
        api=m.group("api") or "",
        hardware=m.group("hardware") or "",
    )


def looks_like_tf_runtime(name: str) -> bool:
    return name.startswith("tpu-vm-tf-")


def why_not_fits(table: RuntimeTable, gen: TpuGeneration, hosts: int, tf: TfRuntime) -> str:
    """Why ``tf`` does not run on ``hosts`` hosts of ``gen`` ("" when it does)."""
    rules = gen.tensorflow
    if tf.hardware and tf.hardware not in rules.hardware:
        return f"it is built for {tf.hardware} hardware, not {gen.label}"
    if rules.min_version and tf.version < Version(rules.min_version):
        return f"TensorFlow {tf.version} predates {gen.label} (needs >= {rules.min_version})"
    own = _own_suffix_problem(gen, tf)
    if own:
        return own
    api = _device_api_problem(table, gen, tf)
    if api:
        return api
    if hosts > 1 and not tf.pod:
        return f"the slice spans {hosts} hosts and needs a -pod runtime"
    return ""


def _own_suffix_problem(gen: TpuGeneration, tf: TfRuntime) -> str:
    rules = gen.tensorflow
    if not rules.own_suffix or not rules.own_until:
        return ""
    until = Version(rules.own_until)
    if tf.version <= until and tf.hardware != rules.own_suffix:
        return f"TensorFlow <= {until} on {gen.label} uses the -{rules.own_suffix} names"
    if tf.version > until and tf.hardware == rules.own_suffix:
        return f"the -{rules.own_suffix} names stop at TensorFlow {until}"
    return ""


def _device_api_problem(table: RuntimeTable, gen: TpuGeneration, tf: TfRuntime) -> str:
    since = Version(table.tensorflow.device_api_from)
    allowed = gen.tensorflow.device_apis
    if tf.version >= since and tf.api not in allowed:
        shown = " or ".join(f"-{a}" for a in allowed)
        if not tf.api:
            return f"from TensorFlow {since} the name must say its device API ({shown})"
        return f"device API -{tf.api} is not used on {gen.label} (use {shown})"
    if tf.version < since and tf.api:
        return f"TensorFlow before {since} runs stream executor only; the name has no -{tf.api}"
    return ""


def published(table: RuntimeTable) -> tuple[str, ...]:
    """Every TensorFlow runtime name Google publishes, per the table."""
    return table.tensorflow.names()


def newest_published(table: RuntimeTable) -> Version:
    return max(Version(v) for v in table.tensorflow.endings)


def same_minor(table: RuntimeTable, version: Version) -> list[str]:
    """Published TF releases with the same major.minor (what exists when a patch does not)."""
    return [v for v in table.tensorflow.endings if Version(v).release[:2] == version.release[:2]]


def choose(table: RuntimeTable, gen: TpuGeneration, hosts: int, version: str | None, pool: Sequence[str]) -> str | None:
    """The best TF runtime in ``pool`` for the hardware: the requested version, else the newest patch of
    its minor, else (no version asked) the generation's recommended release, else the newest that fits."""
    fitting = [tf for tf in map(parse_tf_runtime, pool) if tf is not None and not why_not_fits(table, gen, hosts, tf)]
    if not fitting:
        return None
    # Google's rule names (tpu-vm-tf-2.18.0-pjrt) before the hardware-suffixed exceptions
    fitting.sort(key=lambda tf: (tf.version, tf.api == "pjrt", tf.hardware == "", tf.pod == (hosts > 1)))
    if version:
        wanted = Version(version)
        exact = [tf for tf in fitting if tf.version == wanted]
        minor = [tf for tf in fitting if tf.version.release[:2] == wanted.release[:2]]
        best = exact or minor
        return best[-1].name if best else None
    recommended = [tf for tf in fitting if tf.version == Version(gen.tensorflow.recommended_version)]
    return (recommended or fitting)[-1].name
