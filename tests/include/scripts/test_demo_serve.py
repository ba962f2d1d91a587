"""`make demo-serve`'s serving part, end to end: `demo_serve.serve` on a fresh local cloud (scenario
gke_serving_demo) with a model export in a Cloud Storage directory standing in for the training demo's.

Judged by independent facts: the load generator's own counts (the watch task's XCom: what it sent and what
failed), the completions each vLLM container answered (access-log lines in the pods' container log files on
disk, which outlive the pods; the container's name says the accelerator), the pods the demo saw Ready per
accelerator in the Kubernetes API while it ran, and no process of the local cloud's pods alive afterwards
(scanned here in /proc, not taken from the demo). About 3 minutes on the 2-core machine.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from interlude.serving.loadgen import served_completions

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "include" / "scripts"))

import demo_serve  # noqa: E402 - a script beside demo.py, not a package

# The Airflow homes it makes copy the suite's migrated DB (dev.DB_TEMPLATE_ENV) instead of migrating their own.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("airflow_db_template")]

BUCKET = "interlude-demo"


def _seed_export(gcs_dir: Path, tmp: Path) -> tuple[str, str, Path]:
    """A model export (a fresh reference model, written by the workload's export_hf) in a GCS emulator data
    directory, as the training demo leaves its fine-tuned export; its URI, weights digest and local copy."""
    from interlude_localcloud.gcs import GcsEmulator
    from interlude_workload.gcs import storage_client
    from tests.include.serving.standin_proc import make_export, upload_export

    export = make_export(tmp / "export", seed=3)
    emulator = GcsEmulator(0, gcs_dir)
    emulator.start()
    try:
        client = storage_client(project="interlude-local", emulator=emulator.endpoint)
        client.create_bucket(BUCKET)
        uri = upload_export(export, client, BUCKET, "interlude/demo-serve-test/finetune/export-00000007")
    finally:
        emulator.stop()
    return uri, hashlib.sha256((export / "model.safetensors").read_bytes()).hexdigest(), export


def _greedy_answer(export: Path) -> str:
    """The export's greedy completion of the smoke prompt, computed here with the workload's numpy forward."""
    from tokenizers import Tokenizer

    from interlude.operators.serving import SMOKE_MAX_TOKENS, SMOKE_PROMPT
    from interlude_workload.llm.numpy_forward import greedy_generate, load_export

    weights, config = load_export(export)
    tok = Tokenizer.from_file(str(export / "tokenizer.json"))
    new = greedy_generate(weights, config, tok.encode(SMOKE_PROMPT).ids, SMOKE_MAX_TOKENS)
    return str(tok.decode(new[:-1] if new and new[-1] == 1 else new, skip_special_tokens=True))


def _served_per_container(state: Path) -> tuple[dict[str, int], int]:
    """Completions answered per vLLM container kind (vllm-tpu / vllm-gpu), and non-2xx answers, from disk."""
    served: dict[str, int] = {}
    bad = 0
    for log in state.glob("gke/*/pods/*/vllm-*.log"):
        good, errors = served_completions(log.read_text(errors="replace"))
        kind = log.stem.removeprefix("vllm-")
        served[kind] = served.get(kind, 0) + good
        bad += errors
    return served, bad


def _processes_naming(directory: Path) -> list[int]:
    needle = str(directory.resolve()).encode()
    alive = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and needle in (proc / "environ").read_bytes():
                alive.append(int(proc.name))
        except OSError:
            continue
    return alive


def test_demo_serve_falls_back_scales_out_survives_maintenance_and_leaves_nothing(tmp_path: Path) -> None:
    uri, digest, export = _seed_export(tmp_path / "training-gcs", tmp_path)
    out = demo_serve.serve(uri, tmp_path / "training-gcs", tmp_path / "serve", tmp_path / "airflow")
    print(demo_serve.summary(out))
    states = {r.name: r.state for r in out.runs}
    assert list(states.values()) == ["success"] * 3, states
    stockout, drill, _delete = out.runs

    # 1: in the TPU stockout the replica came up on L4 through Interlude's fallback, serving this export (its
    # weights: their digest; its answer: the model's own greedy completion, computed here)
    fallbacks = stockout.xcoms["rollout"]["fallbacks"]
    assert [f["action"] for f in fallbacks] == ["fall_back_to_gpu"], fallbacks
    assert stockout.xcoms["smoke"]["fingerprint"] == f"fp_{digest[:16]}"
    answer = _greedy_answer(export)
    assert out.expected_answer == answer and out.answers == [answer, answer], (out.answers, answer)
    assert out.ok
    first = next(counts for _, counts in out.seen.timeline if counts)
    assert first == {"gpu": 1}, out.seen.timeline
    assert out.stockout_to_gpu_ready is not None and out.stockout_to_gpu_ready > 0

    # 2: the load generator's own counts: nothing failed through the TPU node's maintenance
    load = drill.xcoms["maintenance_watch"]["load"]
    assert load["failed"] == 0, load["failures"]
    assert load["sent"] >= 20, load  # a sustained load through the drill; how many more, the machine's load decides
    kinds = [d["kind"] for d in drill.xcoms["maintenance_watch"]["decisions"]]
    assert {"cordon", "surge", "drain", "restore"} <= set(kinds), kinds
    assert out.maintained_node and "tpu" in out.maintained_node

    # the servers' own access logs: both kinds answered, every answer a 2xx, each request answered once
    served, bad = _served_per_container(tmp_path / "serve" / "localcloud")
    assert bad == 0
    assert served.get("tpu", 0) > 0 and served.get("gpu", 0) > 0, served
    assert sum(served.values()) == load["sent"] + 2, (served, load)  # + the two deploys' smoke requests

    # what the Kubernetes API showed while it ran: replicas Ready on TPU and on L4 (more than the stockout's one)
    assert out.seen.peak("tpu") >= 1 and out.seen.peak("gpu") >= 2, out.seen.timeline
    assert set(out.seen.ready_on.values()) == {"tpu", "gpu"}
    assert out.seen.per_node == 1  # never two replicas on one node (one vLLM per accelerator)

    # 3: nothing left: no serving pod after delete, no pod process after the local cloud stopped
    assert out.pods_left == []
    assert _processes_naming(tmp_path / "serve" / "localcloud") == []
