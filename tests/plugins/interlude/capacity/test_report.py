"""CapacityReport: availability rules, JSON round trip, table rendering, and the probe's assembly.

The probe is tested against small in-test sources that implement the hook methods over fixed data
(the same return shapes as ``TpuHook`` / ``ComputeHook``); the integration test against the local
cloud lives with the hooks.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from interlude.capacity.probe import CapacityProbeError, probe_capacity, reservation_rooms
from interlude.capacity.report import (
    GPU_QUOTA_METRICS,
    AcceleratorKind,
    CapacityEntry,
    CapacityReport,
    QuotaState,
    ReservationRoom,
    kind_of,
    mark_stockout,
    region_of,
)

NOW = dt.datetime(2026, 11, 3, 12, 0, tzinfo=dt.UTC)


class FixedTpu:
    """TpuHook's read-only methods over fixed data; counts calls."""

    def __init__(
        self,
        types: dict[str, list[str]],
        queued: dict[str, list[dict]] | None = None,
        fail_zones: set[str] = frozenset(),
    ) -> None:
        self.types, self.queued, self.fail_zones = types, queued or {}, fail_zones
        self.calls: list[tuple[str, str]] = []

    def list_accelerator_types(self, zone: str) -> list[str]:
        self.calls.append(("list_accelerator_types", zone))
        if zone in self.fail_zones:
            raise RuntimeError("503 backend unavailable")
        return list(self.types.get(zone, []))

    def list_queued_resources(self, zone: str) -> list[dict]:
        self.calls.append(("list_queued_resources", zone))
        return list(self.queued.get(zone, []))


class FixedCompute:
    """ComputeHook's read-only methods over fixed data; counts calls."""

    def __init__(
        self,
        types: dict[str, list[str]],
        quotas: dict[str, dict[str, tuple[float, float]]],
        reservations: dict[str, list[dict]] | None = None,
        fail_quota: bool = False,
    ) -> None:
        self.types, self.quotas, self.reservations = types, quotas, reservations or {}
        self.fail_quota = fail_quota
        self.calls: list[tuple[str, str]] = []

    def list_accelerator_types(self, zone: str) -> list[str]:
        self.calls.append(("list_accelerator_types", zone))
        return list(self.types.get(zone, []))

    def get_region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        self.calls.append(("get_region_quotas", region))
        if self.fail_quota:
            raise PermissionError("403 compute.regions.get denied")
        return dict(self.quotas.get(region, {}))

    def list_reservations(self, zone: str) -> list[dict]:
        self.calls.append(("list_reservations", zone))
        return list(self.reservations.get(zone, []))


def _reservation(
    name: str,
    machine_type: str,
    count: int,
    in_use: int,
    status: str = "READY",
    accelerators: list[dict] | None = None,
) -> dict:
    props: dict = {"machineType": machine_type}
    if accelerators is not None:
        props["guestAccelerators"] = accelerators
    return {
        "name": name,
        "status": status,
        "specificReservation": {"count": str(count), "inUseCount": str(in_use), "instanceProperties": props},
    }


def _qr(name: str, accel: str, state: str) -> dict:
    return {
        "name": name,
        "state": {"state": state},
        "tpu": {"nodeSpec": [{"parent": "p", "nodeId": name, "node": {"acceleratorType": accel}}]},
    }


ZONES = ["us-central1-a", "us-central1-b", "europe-west4-a"]
TPU_TYPES = ["v6e-8", "v5litepod-8"]
GPU_TYPES = ["nvidia-l4", "nvidia-tesla-t4", "nvidia-a100-80gb", "nvidia-h100-80gb"]


@pytest.fixture
def sources() -> tuple[FixedTpu, FixedCompute]:
    tpu = FixedTpu(
        types={
            "us-central1-a": ["v5litepod-8", "v6e-8"],
            "us-central1-b": ["v5litepod-8"],
            "europe-west4-a": ["v6e-8", "v5litepod-16"],
        },
        queued={
            "us-central1-a": [
                _qr("q1", "v6e-8", "WAITING_FOR_RESOURCES"),
                _qr("q2", "v6e-8", "ACTIVE"),
                _qr("q3", "v6e-8", "FAILED"),
                _qr("q4", "v5litepod-8", "ACCEPTED"),
            ]
        },
    )
    compute = FixedCompute(
        types={
            "us-central1-a": ["nvidia-l4", "nvidia-tesla-t4", "nvidia-h100-80gb"],
            "us-central1-b": ["nvidia-l4", "nvidia-a100-80gb"],
            "europe-west4-a": ["nvidia-l4", "nvidia-tesla-t4"],
        },
        quotas={
            "us-central1": {
                "NVIDIA_L4_GPUS": (8.0, 8.0),
                "NVIDIA_T4_GPUS": (4.0, 1.0),
                "NVIDIA_A100_80GB_GPUS": (16.0, 0.0),
                "PREEMPTIBLE_NVIDIA_L4_GPUS": (16.0, 0.0),
                "PREEMPTIBLE_NVIDIA_H100_GPUS": (8.0, 8.0),
            },
            "europe-west4": {"NVIDIA_L4_GPUS": (2.0, 1.5), "NVIDIA_T4_GPUS": (0.0, 0.0)},
        },
        reservations={
            "us-central1-a": [
                _reservation("h100-res", "a3-highgpu-8g", 2, 1),
                _reservation("l4-creating", "g2-standard-8", 4, 0, status="CREATING"),
                _reservation(
                    "t4-res",
                    "zones/us-central1-a/machineTypes/n1-standard-8",
                    3,
                    1,
                    accelerators=[
                        {
                            "acceleratorType": "projects/p/zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
                            "acceleratorCount": 2,
                        }
                    ],
                ),
                _reservation("l4-full", "g2-standard-8", 2, 2),
                _reservation("cpu-only", "n2-standard-8", 5, 0),
            ]
        },
    )
    return tpu, compute


def test_probe_assembles_every_zone_and_type(sources: tuple[FixedTpu, FixedCompute]) -> None:
    tpu, compute = sources
    report = probe_capacity(
        tpu,
        compute,
        ZONES,
        TPU_TYPES,
        GPU_TYPES,
        stockouts=[("us-central1-a", "nvidia-l4"), ("elsewhere-1a", "v6e-8")],
        now=NOW,
    )
    assert len(report.entries) == len(ZONES) * (len(TPU_TYPES) + len(GPU_TYPES))
    assert report.zones == tuple(ZONES)
    assert report.probed_at == NOW.isoformat()

    v6e = report.get("us-central1-a", "v6e-8")
    assert v6e is not None and v6e.kind == AcceleratorKind.TPU and v6e.offered
    assert v6e.quota == QuotaState.UNKNOWN  # the TPU API exposes no quotas
    assert v6e.queued == 2  # FAILED does not count
    assert v6e.available
    assert report.get("us-central1-a", "v5litepod-8").queued == 1
    assert not report.get("us-central1-b", "v6e-8").offered
    assert report.get("europe-west4-a", "v5litepod-8").offered is False  # only v5litepod-16 there

    l4 = report.get("us-central1-a", "nvidia-l4")
    assert (l4.quota, l4.quota_metric, l4.quota_headroom) == (QuotaState.EXHAUSTED, "NVIDIA_L4_GPUS", 0.0)
    assert (l4.spot_quota, l4.spot_quota_headroom) == (QuotaState.OK, 16.0)
    assert l4.stocked_out and not l4.available
    assert l4.reserved == 0  # l4-creating is not READY, l4-full has no room

    t4 = report.get("us-central1-a", "nvidia-tesla-t4")
    assert (t4.quota, t4.quota_headroom) == (QuotaState.OK, 3.0)
    assert t4.reserved == 4  # 2 free VMs x 2 GPUs, machine type and GPU type read from URLs
    assert t4.reservations == (ReservationRoom("t4-res", "n1-standard-8", 2, 2),)

    h100 = report.get("us-central1-a", "nvidia-h100-80gb")
    assert h100.offered and h100.quota == QuotaState.UNKNOWN and h100.quota_metric is None
    assert h100.spot_quota == QuotaState.EXHAUSTED
    assert h100.reserved == 8 and h100.reservations[0].machine_type == "a3-highgpu-8g"
    assert h100.available

    a100 = report.get("us-central1-b", "nvidia-a100-80gb")
    assert (a100.quota, a100.quota_headroom, a100.available) == (QuotaState.OK, 16.0, True)
    assert not report.get("us-central1-a", "nvidia-a100-80gb").offered

    eu_l4 = report.get("europe-west4-a", "nvidia-l4")
    assert eu_l4.quota == QuotaState.EXHAUSTED  # 0.5 GPU left is no GPU
    eu_t4 = report.get("europe-west4-a", "nvidia-tesla-t4")
    assert eu_t4.quota == QuotaState.EXHAUSTED and not eu_t4.available
    assert any("TPU API exposes none" in n for n in report.notes)


def test_probe_reads_quotas_once_per_region_and_only_reads(sources: tuple[FixedTpu, FixedCompute]) -> None:
    tpu, compute = sources
    probe_capacity(tpu, compute, ZONES, TPU_TYPES, GPU_TYPES, now=NOW)
    quota_calls = [c for c in compute.calls if c[0] == "get_region_quotas"]
    assert quota_calls == [("get_region_quotas", "us-central1"), ("get_region_quotas", "europe-west4")]
    called = {name for name, _ in tpu.calls + compute.calls}
    assert called == {
        "list_accelerator_types",
        "list_queued_resources",
        "get_region_quotas",
        "list_reservations",
    }


def test_probe_failures_become_notes_and_honest_answers(sources: tuple[FixedTpu, FixedCompute]) -> None:
    tpu, compute = sources
    tpu.fail_zones = {"us-central1-a"}
    compute.fail_quota = True
    report = probe_capacity(tpu, compute, ZONES, TPU_TYPES, GPU_TYPES, now=NOW)
    assert not report.get("us-central1-a", "v6e-8").offered
    assert report.get("europe-west4-a", "v6e-8").offered
    assert all(e.quota == QuotaState.UNKNOWN for e in report.entries)
    assert any("tpu.list_accelerator_types(us-central1-a) failed: RuntimeError: 503" in n for n in report.notes)
    assert any("compute.get_region_quotas(us-central1) failed: PermissionError" in n for n in report.notes)


def test_probe_that_learned_nothing_about_a_family_fails_loudly(
    sources: tuple[FixedTpu, FixedCompute],
) -> None:
    """Every offered-types read failing (wrong project, no permission) must not look like "no capacity"."""
    tpu, compute = sources
    tpu.fail_zones = set(ZONES)
    with pytest.raises(CapacityProbeError, match="could not list offered TPU types in any zone") as info:
        probe_capacity(tpu, compute, ZONES, TPU_TYPES, GPU_TYPES, now=NOW)
    assert len([n for n in info.value.notes if "tpu.list_accelerator_types" in n]) == len(ZONES)
    assert "503 backend unavailable" in str(info.value)
    # the GPU side alone still works when no TPU types are asked for
    report = probe_capacity(tpu, compute, ZONES, [], GPU_TYPES, now=NOW)
    assert report.get("us-central1-a", "nvidia-l4").offered


def test_probe_without_hooks_or_types() -> None:
    report = probe_capacity(None, None, ["us-central1-a"], ["v6e-8"], ["nvidia-l4"], now=NOW)
    assert [e.offered for e in report.entries] == [False, False]
    assert any("no TPU hook" in n for n in report.notes) and any("no Compute hook" in n for n in report.notes)
    empty = probe_capacity(None, None, ["us-central1-a"], [], [], now=NOW)
    assert empty.entries == () and empty.notes == ()


def test_gpu_quota_metric_mapping() -> None:
    assert GPU_QUOTA_METRICS["nvidia-l4"][0] == "NVIDIA_L4_GPUS"
    assert GPU_QUOTA_METRICS["nvidia-tesla-t4"][0] == "NVIDIA_T4_GPUS"
    assert GPU_QUOTA_METRICS["nvidia-tesla-a100"][0] == "NVIDIA_A100_GPUS"
    assert GPU_QUOTA_METRICS["nvidia-a100-80gb"][0] == "NVIDIA_A100_80GB_GPUS"
    for no_metric in ("nvidia-h100-80gb", "nvidia-h200-141gb", "nvidia-b200"):
        assert GPU_QUOTA_METRICS[no_metric][0] is None


def test_reservation_rooms_skips_what_cannot_be_used() -> None:
    rooms = reservation_rooms(
        [
            _reservation("a", "a2-ultragpu-1g", 3, 0),
            _reservation("b", "a2-ultragpu-1g", 3, 3),
            _reservation("c", "g2-standard-48", 1, 0, status="DELETING"),
            _reservation("d", "mystery-machine", 1, 0),
            {"name": "e"},
        ]
    )
    assert rooms == {"nvidia-a100-80gb": [ReservationRoom("a", "a2-ultragpu-1g", 3, 1)]}


@pytest.mark.parametrize(
    ("entry", "available"),
    [
        (CapacityEntry("z-a", "v6e-8", AcceleratorKind.TPU, offered=True), True),
        (CapacityEntry("z-a", "v6e-8", AcceleratorKind.TPU, offered=False), False),
        (CapacityEntry("z-a", "v6e-8", AcceleratorKind.TPU, offered=True, stocked_out=True), False),
        (CapacityEntry("z-a", "nvidia-l4", AcceleratorKind.GPU, offered=True, quota=QuotaState.OK), True),
        (
            CapacityEntry("z-a", "nvidia-l4", AcceleratorKind.GPU, offered=True, quota=QuotaState.EXHAUSTED),
            False,
        ),
        # reserved room was charged to quota when it was made: usable with on-demand quota used up
        (
            CapacityEntry(
                "z-a", "nvidia-l4", AcceleratorKind.GPU, offered=True, quota=QuotaState.EXHAUSTED, reserved=1
            ),
            True,
        ),
        (
            CapacityEntry(
                "z-a",
                "nvidia-l4",
                AcceleratorKind.GPU,
                offered=True,
                quota=QuotaState.EXHAUSTED,
                reserved=1,
                stocked_out=True,
            ),
            False,
        ),
    ],
)
def test_available_rule(entry: CapacityEntry, available: bool) -> None:
    assert entry.available is available


def test_quota_allows_counts_headroom() -> None:
    e = CapacityEntry(
        "z-a",
        "nvidia-h100-80gb",
        AcceleratorKind.GPU,
        True,
        quota=QuotaState.OK,
        quota_headroom=4.0,
        spot_quota=QuotaState.OK,
        spot_quota_headroom=8.0,
    )
    assert e.quota_allows(4) and not e.quota_allows(8)
    assert e.spot_quota_allows(8) and not e.spot_quota_allows(9)
    assert CapacityEntry("z-a", "v6e-8", AcceleratorKind.TPU, True).quota_allows(1000)


def _sample_report() -> CapacityReport:
    return CapacityReport(
        entries=(
            CapacityEntry("us-central1-a", "v6e-8", AcceleratorKind.TPU, True, queued=2),
            CapacityEntry(
                "us-central1-a",
                "nvidia-l4",
                AcceleratorKind.GPU,
                True,
                QuotaState.EXHAUSTED,
                "NVIDIA_L4_GPUS",
                0.0,
                QuotaState.OK,
                16.0,
                stocked_out=True,
            ),
            CapacityEntry(
                "us-central1-a",
                "nvidia-h100-80gb",
                AcceleratorKind.GPU,
                True,
                reserved=8,
                reservations=(ReservationRoom("h100-res", "a3-highgpu-8g", 1, 8),),
            ),
            CapacityEntry("europe-west4-a", "v6e-8", AcceleratorKind.TPU, False),
        ),
        probed_at=NOW.isoformat(),
        notes=("TPU quotas: unknown",),
    )


def test_report_json_round_trip() -> None:
    report = _sample_report()
    again = CapacityReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    assert again.get("us-central1-a", "nvidia-h100-80gb").reservations[0].name == "h100-res"


def test_probed_report_json_round_trip(sources: tuple[FixedTpu, FixedCompute]) -> None:
    report = probe_capacity(
        *sources, ZONES, TPU_TYPES, GPU_TYPES, stockouts=[("us-central1-b", "v5litepod-8")], now=NOW
    )
    assert CapacityReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_table_rendering() -> None:
    text = _sample_report().table()
    lines = text.splitlines()
    assert lines[0] == f"Capacity report at {NOW.isoformat()}"
    assert lines[1].split() == [
        "zone",
        "type",
        "kind",
        "platform",
        "offered",
        "quota",
        "headroom",
        "reserved",
        "queued",
        "stockout",
        "available",
    ]
    assert set(lines[2].replace(" ", "")) == {"-"}
    row = ["us-central1-a", "v6e-8", "tpu", "tpu_api", "yes", "unknown", "-", "0", "2", "no", "yes"]
    assert lines[3].split() == row
    assert lines[4].split() == [
        "us-central1-a",
        "nvidia-l4",
        "gpu",
        "compute",
        "yes",
        "exhausted",
        "0",
        "0",
        "0",
        "YES",
        "no",
    ]
    assert lines[5].split()[-4:] == ["8", "0", "no", "yes"]
    assert lines[6].split()[:5] == ["europe-west4-a", "v6e-8", "tpu", "tpu_api", "no"]
    # columns line up: every row has the "type" column starting at the same offset
    offset = lines[1].index("type")
    assert all(line[offset - 2 : offset] == "  " and line[offset] != " " for line in lines[3:7])
    assert lines[-1] == "note: TPU quotas: unknown"
    assert "no zone x accelerator pairs probed" in CapacityReport(entries=()).table()


def test_describe_lines() -> None:
    r = _sample_report()
    assert r.get("europe-west4-a", "v6e-8").describe() == "europe-west4-a: not offered"
    l4 = r.get("us-central1-a", "nvidia-l4").describe()
    assert "quota exhausted (0 free of NVIDIA_L4_GPUS)" in l4 and "STOCKOUT" in l4
    assert "TPU API exposes none" in r.get("us-central1-a", "v6e-8").describe()


def test_mark_stockout_returns_new_report() -> None:
    report = _sample_report()
    marked = mark_stockout(report, "us-central1-a", "v6e-8")
    assert marked.get("us-central1-a", "v6e-8").stocked_out
    assert not marked.get("us-central1-a", "v6e-8").available
    assert not report.get("us-central1-a", "v6e-8").stocked_out  # the original is untouched
    assert [e.accelerator_type for e in marked.entries] == [e.accelerator_type for e in report.entries]
    added = mark_stockout(report, "asia-east1-c", "nvidia-l4")
    entry = added.get("asia-east1-c", "nvidia-l4")
    assert entry is not None and entry.stocked_out and entry.kind == AcceleratorKind.GPU
    assert len(added.entries) == len(report.entries) + 1


def test_helpers() -> None:
    assert region_of("us-central1-a") == "us-central1"
    assert region_of("europe-west4-b") == "europe-west4"
    with pytest.raises(ValueError, match="not a zone name"):
        region_of("nozone")
    assert kind_of("nvidia-l4") == AcceleratorKind.GPU and kind_of("v6e-8") == AcceleratorKind.TPU
    assert _sample_report().available("v6e-8")[0].zone == "us-central1-a"
