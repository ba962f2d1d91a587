"""benchmarks/export_parity.py run as a user would: copied alone next to an export, in this venv (no torch)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

SCRIPT = Path(__file__).resolve().parents[4] / "benchmarks" / "export_parity.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _run(script: Path, export: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), str(export)], capture_output=True, text=True, timeout=600, cwd=script.parent
    )


@pytest.mark.skipif(HAS_TORCH, reason="the no-torch path; with torch the script runs transformers too")
def test_the_script_alone_checks_an_export_and_skips_without_torch(export_dir: Path, tmp_path: Path) -> None:
    alone = tmp_path / "elsewhere" / "export_parity.py"  # no Interlude next to it
    alone.parent.mkdir()
    shutil.copyfile(SCRIPT, alone)
    done = _run(alone, export_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped: torch not installed" in done.stdout
    assert done.stdout.count(" yes ") == 4  # each prompt: the numpy forward's tokens are the JAX model's


def test_the_script_flags_weights_that_are_not_the_models(export_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "hf"
    shutil.copytree(export_dir, bad)
    weights = load_file(str(bad / "model.safetensors"))
    weights["model.layers.0.self_attn.q_proj.weight"][:, :64] *= 1.01
    save_file(weights, str(bad / "model.safetensors"), metadata={"format": "pt"})
    done = _run(SCRIPT, bad)
    assert done.returncode == 1, done.stdout + done.stderr


def test_the_script_refuses_a_directory_without_a_reference(tmp_path: Path) -> None:
    done = _run(SCRIPT, tmp_path)
    assert done.returncode == 2 and "not a verified Interlude export" in done.stderr
