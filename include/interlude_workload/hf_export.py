"""The fine-tune's Hugging Face model directory in Cloud Storage: what vLLM serves, written once per stage.

``gs://BUCKET/interlude/RUN_KEY/STAGE/export/`` (``layout.export_prefix``) holds ``llm.export``'s files, uploaded
after the export verified locally against the JAX model; ``interlude_export.json`` goes last and is the
export's commit marker (step, the weights' digest, each file's size and CRC32C). A reader (the training DAG
publishing the Asset event, the serving DAG) takes the directory only when the marker is there and every file
it names has that size; loaders ignore the extra JSON (vLLM reads ``*.safetensors`` and the config/tokenizer
files; https://docs.vllm.ai/en/latest/models/extensions/runai_model_streamer.html).

Idempotent and never over a committed export: a retried stage that finds the marker for the same step and
digest does nothing; a marker for other weights is an error (it does not happen within one run key: ``fresh``
wipes the whole stage prefix, export included).
"""

from __future__ import annotations

import base64
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlude_workload import layout

MARKER = "interlude_export.json"
MARKER_FORMAT = "interlude-export/1"
EXPORT_STAGES = ("finetune",)  # the reference trainer's stages that end in an export (its --export auto)
STAGE_MARKER = f"{layout.EXPORT_DIR}{MARKER}"  # the marker's name relative to the stage's prefix


def exports(stage: str, command: object = None) -> bool:
    """Whether the stage is done only once its export is committed: the reference trainer's fine-tune. A user's own
    job (``command``) writes no export; its stage is done at its final committed step."""
    return not command and stage in EXPORT_STAGES


class ExportConflict(RuntimeError):
    """A committed export of other weights is where this one would go."""


@dataclass(frozen=True)
class ExportResult:
    uri: str
    written: bool
    files: int


def uri(bucket: str, run_key: str, stage: str) -> str:
    return layout.uri(bucket, layout.export_prefix(run_key, stage)).rstrip("/")


def read_marker(client: Any, bucket: str, run_key: str, stage: str) -> dict[str, Any] | None:
    """The committed export's marker, when the export is whole (every file it names listed with its size)."""
    from google.api_core.exceptions import NotFound

    prefix = layout.export_prefix(run_key, stage)
    try:
        marker = json.loads(client.bucket(bucket).blob(prefix + MARKER).download_as_bytes())
    except NotFound:
        return None
    sizes = {b.name[len(prefix) :]: b.size for b in client.list_blobs(bucket, prefix=prefix)}
    files = marker.get("files") or {}
    if not files or any(sizes.get(name) != meta.get("size") for name, meta in files.items()):
        return None
    return dict(marker)


def publish(
    client: Any, bucket: str, run_key: str, stage: str, *, step: int, digest: str, params: Any, size: str | None = None
) -> ExportResult:
    """Export ``params`` (the final step's weights), verify, upload, then write the marker. Raises
    ``llm.export.ExportError`` when the export does not reproduce the JAX model (nothing is uploaded then)."""
    where = uri(bucket, run_key, stage)
    existing = read_marker(client, bucket, run_key, stage)
    if existing is not None:
        if existing.get("step") == step and existing.get("params_sha256") == digest:
            return ExportResult(where, written=False, files=len(existing["files"]))
        raise ExportConflict(f"{where} holds an export of step {existing.get('step')}, not of step {step} ({digest})")
    from interlude_workload.llm import export, tokenizer
    from interlude_workload.llm.train_step import DEFAULT_SIZE
    from interlude_workload.llm.train_step import size as model_size

    prefix = layout.export_prefix(run_key, stage)
    files: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="interlude-export-") as tmp:
        export.export_hf(params, model_size(size or DEFAULT_SIZE).config, tokenizer.SHIPPED_DIR, tmp)
        for path in sorted(Path(tmp).iterdir()):
            blob = client.bucket(bucket).blob(prefix + path.name)
            blob.upload_from_filename(str(path))
            files[path.name] = {"size": path.stat().st_size, "crc32c": _crc32c(path)}
    marker = {"format": MARKER_FORMAT, "step": step, "params_sha256": digest, "files": files}
    client.bucket(bucket).blob(prefix + MARKER).upload_from_string(
        json.dumps(marker, sort_keys=True), content_type="application/json"
    )
    return ExportResult(where, written=True, files=len(files))


def _crc32c(path: Path) -> str:
    """GCS's base64 CRC32C of the file (what ``blob.crc32c`` says once uploaded)."""
    import google_crc32c

    checksum = google_crc32c.Checksum()
    checksum.update(path.read_bytes())
    return base64.b64encode(checksum.digest()).decode()
