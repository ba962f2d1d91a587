"""Request bodies as Google documents them, and startup scripts that quote everything."""

from __future__ import annotations

import shlex
import subprocess

from interlude.machines import provisioning

HOSTILE = "run'; rm -rf / #$(touch /tmp/pwned)"


def test_startup_script_quotes_every_value() -> None:
    script = provisioning.startup_script("bucket", HOSTILE, 0.5)
    line = next(x for x in script.splitlines() if "-m interlude_workload.agent" in x)
    argv = shlex.split(line)
    assert argv[argv.index("--run-key") + 1] == HOSTILE
    # bash parses it without running anything but the (absent) agent
    subprocess.run(["bash", "-n", "-c", script], check=True)


def test_gpu_vm_terminates_on_host_maintenance_and_has_no_external_ip() -> None:
    req = provisioning.machine_record(
        {
            "kind": "gpu",
            "zone": "us-central1-a",
            "accelerator_type": "nvidia-l4",
            "count": 1,
            "machine_type": "g2-standard-8",
            "mode": "on_demand",
        },
        "common-cu128",
        bucket="b",
        run_key="k-abc",
        dag_id="d",
    )
    body = req.body
    assert req.kind == "gce_vm" and req.name == "k-abc-vm"
    assert body["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
        "provisioningModel": "STANDARD",
    }
    assert all("accessConfigs" not in nic for nic in body["networkInterfaces"])
    assert "guestAccelerators" not in body  # G2 carries its GPUs in the machine type
    assert body["labels"]["interlude-run"] == "k-abc"


def test_spot_t4_vm_attaches_guest_accelerators() -> None:
    req = provisioning.machine_record(
        {
            "kind": "gpu",
            "zone": "z",
            "accelerator_type": "nvidia-tesla-t4",
            "count": 2,
            "machine_type": "n1-standard-8",
            "mode": "spot",
        },
        "img",
        bucket="b",
        run_key="k",
        dag_id="d",
    )
    assert req.body["scheduling"]["provisioningModel"] == "SPOT"
    assert req.body["scheduling"]["automaticRestart"] is False
    assert req.body["guestAccelerators"][0]["acceleratorCount"] == 2


def test_tpu_node_body() -> None:
    req = provisioning.machine_record(
        {"kind": "tpu", "zone": "us-central1-a", "accelerator_type": "v6e-8", "mode": "spot"},
        "v2-alpha-tpuv6e",
        bucket="b",
        run_key="k",
        dag_id="d",
        service_account="sa@p.iam.gserviceaccount.com",
    )
    body = req.body
    assert (req.kind, req.name) == ("tpu_node", "k-tpu")
    assert body["acceleratorType"] == "v6e-8" and body["runtimeVersion"] == "v2-alpha-tpuv6e"
    assert body["networkConfig"]["enableExternalIps"] is False
    assert body["schedulingConfig"] == {"spot": True}
    assert "interlude_workload.agent" in body["metadata"]["startup-script"]
