"""The runtime check of a TPU VM created on Compute Engine (interlude.runtimes.compute_tpu): an OS image, not a
TPU runtime version; the framework checked against the generation as on the TPU API.

Expected image names are Google's TPU OS images (https://cloud.google.com/tpu/docs/tpu-os-images): project
ubuntu-os-accelerator-images, family ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e for v5e, v5p and v6e.
"""

from __future__ import annotations

import pytest

from interlude import runtimes
from interlude.machines import provisioning

IMAGE = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"


@pytest.mark.parametrize("accel", ["v6e-1", "v6e-4", "v6e-8", "v5p-8"])
def test_blank_image_is_googles_tpu_os_image(accel: str) -> None:
    check = runtimes.validate(accel, "", "jax", None, platform="compute")
    assert check.ok and check.runtime == IMAGE, check.message()
    assert runtimes.validate(accel, IMAGE, "jax", None, platform="compute").ok


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("v2-alpha-tpuv6e", "Cloud TPU API runtime version"),
        ("tpu-vm-tf-2.18.0-pjrt", "Cloud TPU API runtime version"),
        ("common-cu128-ubuntu-2204-nvidia-570", "GPU image"),
    ],
)
def test_images_without_a_compute_engine_tpu_are_refused(image: str, says: str) -> None:
    check = runtimes.validate("v6e-8", image, "jax", None, platform="compute")
    assert not check.ok and any(says in p for p in check.problems), check.message()
    assert f"use {IMAGE}" in check.message()


def test_a_custom_image_is_a_warning_naming_what_it_must_do() -> None:
    check = runtimes.validate("v6e-8", "my-team-tpu-image", "jax", None, platform="compute")
    assert check.ok and "vfio-pci" in check.warnings[0] and "custom-os-image" in check.warnings[0]


def test_types_compute_engine_does_not_sell_and_frameworks_the_generation_lacks() -> None:
    assert not runtimes.validate("v5litepod-8", "", "jax", None, platform="compute").ok
    assert not runtimes.validate("v6e-16", "", "jax", None, platform="compute").ok  # multi-host
    assert not runtimes.validate("v6e-8", "", "jax", "0.1.0", platform="compute").ok  # older than the table's floor
    tf = runtimes.validate("v6e-8", "", "tensorflow", "2.18.0", platform="compute")
    assert tf.ok and any("tpu-vm-tf" in w for w in tf.warnings)
    # without the platform, the same call is the TPU API's check (a runtime version)
    assert runtimes.validate("v6e-8", "", "jax", None).runtime == "v2-alpha-tpuv6e"


def test_a_compute_decision_makes_a_tpu_vm_instance_not_a_tpu_node() -> None:
    decision = {"kind": "tpu", "zone": "us-central1-a", "accelerator_type": "v6e-8", "count": 1, "mode": "spot"}
    machine = provisioning.machine_record(
        {**decision, "platform": "compute", "machine_type": "ct6e-standard-8t"},
        IMAGE,
        bucket="b",
        run_key="k-abc",
        dag_id="d",
    )
    body = machine.body
    assert (machine.kind, machine.platform, machine.machine_type, machine.name) == (
        "gce_vm",
        "compute",
        "ct6e-standard-8t",
        "k-abc-vm",
    )
    assert body["machineType"] == "zones/us-central1-a/machineTypes/ct6e-standard-8t"
    assert body["disks"][0]["initializeParams"]["sourceImage"] == (
        f"projects/ubuntu-os-accelerator-images/global/images/family/{IMAGE}"
    )
    assert "guestAccelerators" not in body and body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert [i["key"] for i in body["metadata"]["items"]][:1] == ["startup-script"]
    assert "install-nvidia-driver" not in [i["key"] for i in body["metadata"]["items"]]
    node = provisioning.machine_record(decision, "v2-alpha-tpuv6e", bucket="b", run_key="k-abc", dag_id="d")
    assert (node.kind, node.platform) == ("tpu_node", "tpu_api")  # no platform: the TPU API, as before
    with pytest.raises(ValueError, match="not a Compute Engine TPU machine type"):
        provisioning.machine_record(
            {**decision, "accelerator_type": "v5litepod-8", "platform": "compute"},
            IMAGE,
            bucket="b",
            run_key="k",
            dag_id="d",
        )
