"""The local cloud's runtime catalog speaks Google's names, and the runtime check agrees with it.

Every name a zone lists must be one the runtime table accepts on that generation (the zone's list is the
authority the pipeline validates against, so a made-up name here would test nothing real).
"""

from __future__ import annotations

import pytest

from interlude.runtimes import default_table, parse_tf_runtime, validate
from interlude_localcloud import scenario
from interlude_localcloud.catalog import TPU_RUNTIME_VERSIONS, runtime_versions_for

SAMPLE_TYPE = {"v6e": "v6e-8", "v5litepod": "v5litepod-8", "v5p": "v5p-8", "v4": "v4-8", "v3": "v3-8", "v2": "v2-8"}
POD_TYPE = {"v6e": "v6e-16", "v5litepod": "v5litepod-16", "v5p": "v5p-16", "v4": "v4-16", "v3": "v3-32", "v2": "v2-32"}


@pytest.mark.parametrize("family", sorted(TPU_RUNTIME_VERSIONS))
def test_every_listed_runtime_fits_its_family(family: str) -> None:
    table = default_table()
    for name in TPU_RUNTIME_VERSIONS[family]:
        tf = parse_tf_runtime(name)
        accel = POD_TYPE[family] if tf is not None and tf.pod else SAMPLE_TYPE[family]
        framework = "tensorflow" if tf is not None else None
        check = validate(accel, name, framework, offered_runtime_versions=TPU_RUNTIME_VERSIONS[family])
        assert check.ok, check.message()
        if tf is not None:
            assert name in table.tensorflow.names(), name  # a name Google publishes
        else:
            gen = next(g for g in table.tpu_generations.values() if g.prefix.startswith(family))
            assert name in gen.runtimes + gen.legacy_runtimes, name


def test_default_scenario_lists_googles_names_for_its_types() -> None:
    sc = scenario.load("default")
    for zone in sc.zones.values():
        assert zone.runtime_versions == runtime_versions_for(zone.tpu_types)
        assert "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6" in zone.runtime_versions
        # the pipeline picks the hardware-suffixed TF runtime from the zone's list
        check = validate("v6e-8", "", "tensorflow", offered_runtime_versions=zone.runtime_versions)
        assert check.ok and check.runtime == "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6", check.message()


def test_explicit_list_wins() -> None:
    sc = scenario.parse({"zones": {"z-a": {"tpu": {"accelerator_types": ["v6e-8"], "runtime_versions": []}}}})
    assert sc.zones["z-a"].runtime_versions == []
