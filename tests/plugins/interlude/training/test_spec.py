"""RunSpec: one default per param, every refusal names its param, JSON round trip, the form matches."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from interlude.training.spec import MAX_STEPS, RunSpec, RunSpecError, bucket_problem

ROOT = Path(__file__).resolve().parents[4]


def _refused(**params: object) -> str:
    with pytest.raises(RunSpecError) as info:
        RunSpec.from_params(params, dag_id="d", run_id="r", run_key="k")
    return str(info.value)


# -- the single defaults (each was a disagreement between modules before RunSpec) ----------------------
def test_poll_seconds_has_one_default_everywhere() -> None:
    """Was 1.0 in lifecycle.py, 5.0 in operators/stage.py and 12.0 in operators/capacity.py."""
    from interlude.operators.capacity import WaitForCapacityOperator
    from interlude.operators.stage import TrainingStageOperator

    spec = RunSpec().to_dict()
    stage = TrainingStageOperator(task_id="t", machine={}, spec=spec, stage="train", order=1)
    wait = WaitForCapacityOperator(task_id="w", spec=spec, decision={})
    assert RunSpec().poll_seconds == 1.0
    assert stage.poll_interval == 1.0
    assert wait.poll_interval == 5 * 1.0


def test_restart_timeout_has_one_default_everywhere() -> None:
    """Was 600 in the operator and 120 in the DAG's params."""
    from interlude.operators.stage import TrainingStageOperator

    stage = TrainingStageOperator(task_id="t", machine={}, spec=RunSpec().to_dict(), stage="train", order=1)
    assert stage.restart_timeout == RunSpec().restart_timeout_seconds == 120.0


def test_the_dag_form_is_generated_from_runspec() -> None:
    """The form's defaults are RunSpec's (a drift between form and code is impossible by construction)."""
    form = RunSpec.form_schema()
    assert set(form) == set(RunSpec.param_names())
    for name, (default, schema) in form.items():
        field_default = getattr(RunSpec(), name)
        assert default == (list(field_default) if isinstance(field_default, tuple) else field_default), name
        assert schema["description"], name


def test_every_param_declares_draft_07_and_its_default_passes_airflows_check() -> None:
    """Airflow checks each schema against its meta-schema on every validation; draft-07's is ~3x cheaper to
    walk than 2020-12's, the dialect jsonschema assumes when none is declared (interlude.params.DIALECT)."""
    import jsonschema
    from airflow.sdk import Param

    from interlude.serving.spec import ServeSpec

    for spec in (RunSpec, ServeSpec):
        for name, (default, schema) in spec.form_schema().items():
            assert jsonschema.validators.validator_for(schema) is jsonschema.Draft7Validator, name
            assert Param(default, **schema).resolve() == default, name


def test_every_blank_default_is_nullable_so_the_form_submits_as_is() -> None:
    """Airflow's form treats a plain "string" param with a blank default as required and greys out Trigger."""
    for name, (default, schema) in RunSpec.form_schema().items():
        if default is None:
            assert schema["type"] == ["null", "string"], name
        else:
            assert default != "", name


def test_defaults_pass_their_own_checks() -> None:
    spec = RunSpec.from_params({}, dag_id="d", run_id="r", run_key="k")
    assert spec == RunSpec(dag_id="d", run_id="r", run_key="k")


# -- JSON ------------------------------------------------------------------------------------------------
def test_json_round_trip_is_exact() -> None:
    spec = RunSpec.from_params(
        {"zones": ["europe-west4-a"], "network": "vpc-a", "spot": True, "seed": 7},
        dag_id="d",
        run_id="manual__x",
        run_key="k",
        fresh_token="t",
    )
    again = RunSpec.from_json(spec.to_json())
    assert again == spec
    assert json.loads(spec.to_json())["zones"] == ["europe-west4-a"]
    job = spec.replace(workload_command=("python", "job.py", "--dir={checkpoint_dir}"))
    assert RunSpec.from_json(job.to_json()) == job


def test_tpu_types_replace_the_profiles_tpu_candidates_in_order() -> None:
    spec = RunSpec.from_params({"tpu_types": ["v5litepod-16", "v6e-8"]}, dag_id="d", run_id="r", run_key="k")
    profile = spec.profile()
    assert [c.accelerator_type for c in profile.tpu_candidates] == ["v5litepod-16", "v6e-8"]
    assert profile.gpu_candidates == spec.replace(tpu_types=()).profile().gpu_candidates
    assert RunSpec.from_json(spec.to_json()) == spec


def test_platforms_default_to_tpu_nodes_and_gpu_vms_and_round_trip() -> None:
    spec = RunSpec.from_params({}, dag_id="d", run_id="r", run_key="k")
    assert spec.platforms == ("tpu_api", "compute")
    chosen = RunSpec.from_params({"platforms": ["gke", "compute"], **GKE}, dag_id="d", run_id="r", run_key="k")
    assert chosen.platforms == ("gke", "compute") and RunSpec.from_json(chosen.to_json()) == chosen
    assert chosen.gke_cluster == "train" and chosen.gke_image == GKE["gke_image"]
    later = RunSpec.from_params({"platforms": ["compute", "gke"]}, dag_id="d", run_id="r", run_key="k")
    assert later.gke_cluster is None, "the gke params are needed only where gke is the run's platform"


GKE = {
    "gke_cluster": "train",
    "gke_location": "us-central1",
    "gke_image": "us-docker.pkg.dev/p/interlude/workload:1",
    "tpu_types": ["v6e-4"],
    "zones": ["us-central1-b"],
}


def test_tpu7x_types_are_accepted_when_gke_is_a_platform() -> None:
    """The spec lets a TPU7x type through to the trees when GKE may be asked (the plan goes to GKE:
    tests/plugins/interlude/capacity/test_platforms.py); the GKE stage's own shapes decide what it provisions."""
    params = {"tpu_types": ["tpu7x-8"], "platforms": ["tpu_api", "gke"]}
    spec = RunSpec.from_params(params, dag_id="d", run_id="r", run_key="k")
    assert [c.accelerator_type for c in spec.profile().tpu_candidates] == ["tpu7x-8"]


def test_a_drill_is_accepted_on_gke() -> None:
    """GKE drills go to the VM under the pod's node (interlude.stage.gke_observe; the faults' GKE stage test)."""
    spec = RunSpec.from_params({"platforms": ["gke"], **GKE, "drill_maintenance": True}, run_key="k")
    assert spec.drill_maintenance


def test_empty_strings_mean_not_set() -> None:
    spec = RunSpec.from_params({"gpu_image": "", "network": "", "data_date": None}, dag_id="d", run_id="r", run_key="k")
    assert spec.gpu_image is None and spec.network is None and spec.data_date is None


# -- refusals name the param ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"train_steps": 10**30}, "train_steps"),
        ({"finetune_steps": MAX_STEPS + 1}, "finetune_steps"),
        ({"train_steps": 0}, "train_steps"),
        ({"checkpoint_every": 100, "train_steps": 50}, "checkpoint_every"),
        ({"train_steps": "sixty"}, "train_steps"),
        ({"train_steps": True}, "train_steps"),
        ({"step_seconds": 1e9}, "step_seconds"),
        ({"poll_seconds": 0}, "poll_seconds"),
        ({"spot": "yes"}, "spot"),
        ({"zones": "us-central1-a"}, "zones"),
        ({"zones": []}, "zones"),
        ({"zones": ["mars"]}, "zones"),
        ({"zones": ["us-central1-a/../../x"]}, "zones"),
        ({"zones": ["us-central1-a", "us-central1-a"]}, "zones"),
        ({"bucket": "--help"}, "bucket"),
        ({"bucket": "..."}, "bucket"),
        ({"bucket": "bücket"}, "bucket"),
        ({"bucket": "Upper"}, "bucket"),
        ({"bucket": "googlebucket"}, "bucket"),
        ({"bucket": "192.168.5.4"}, "bucket"),
        ({"network": "not a network"}, "network"),
        ({"network": "https://evil.example/x"}, "network"),
        ({"subnetwork": "regions/us/subnetworks/a b"}, "subnetwork"),
        ({"service_account": "me@example.com"}, "service_account"),
        ({"gpu_image": "Common CU123"}, "gpu_image"),
        ({"tpu_runtime_version": "v2 alpha"}, "tpu_runtime_version"),
        ({"framework_version": "latest"}, "framework_version"),
        ({"data_date": "2024-02-30"}, "data_date"),
        ({"data_date": "yesterday"}, "data_date"),
        ({"model_profile": "gpt-9"}, "model_profile"),
        ({"strategy": "cheapest"}, "strategy"),
        ({"resume_policy": "maybe"}, "resume_policy"),
        ({"network": "vpc\nINFO forged log line"}, "network"),
        ({"bucket": "ok-bucket\r"}, "bucket"),
        ({"zones": ["us-central1-a\x1b[31m"]}, "zones"),
        ({"no_such_param": 1}, "no_such_param"),
        ({"down_budget_seconds": -1}, "down_budget_seconds"),
        ({"down_budget_seconds": "an hour"}, "down_budget_seconds"),
        ({"reprovision_margin_seconds": -5}, "reprovision_margin_seconds"),
        ({"checkpoint_margin_commits": 0.5}, "checkpoint_margin_commits"),
        ({"checkpoint_margin_min_seconds": 1e9}, "checkpoint_margin_min_seconds"),
        ({"start_early_within_seconds": True}, "start_early_within_seconds"),
        ({"workload_command": "python train.py"}, "workload_command"),
        ({"workload_command": ["python", "{checkpoint_dri}"]}, "workload_command[1]: unknown placeholder"),
        ({"workload_command": ["python", "{steps:>9}"]}, "workload_command[1]"),
        ({"workload_command": ["python", "{0}"]}, "workload_command[1]"),
        ({"workload_command": ["python", "{"]}, "workload_command[1]"),
        ({"workload_command": ["", "x"]}, "workload_command: the first argument"),
        ({"workload_command": ["python", "a\nb"]}, "workload_command"),
        ({"workload_command": ["python", 3]}, "workload_command"),
        ({"workload_command": ["x"] * 65}, "workload_command: at most 64"),
        ({"tpu_types": ["v9-8"]}, "tpu_types: 'v9-8' is not a TPU type"),
        ({"tpu_types": ["v6e-3"]}, "tpu_types: 'v6e-3' is not a TPU type"),
        ({"tpu_types": ["nvidia-l4"]}, "tpu_types"),
        ({"tpu_types": ["v6e-16", "v6e-16"]}, "tpu_types: a type is listed twice"),
        ({"tpu_types": "v6e-16"}, "tpu_types"),
        ({"platforms": ["tpu-api"]}, "platforms"),
        ({"platforms": []}, "platforms"),
        ({"platforms": ["gke", "gke"]}, "platforms"),
        ({"platforms": "gke"}, "platforms"),
        ({"platforms": ["gke"], **GKE, "gke_cluster": None}, "gke_cluster: None is not a GKE cluster name"),
        ({"platforms": ["gke"], **GKE, "gke_cluster": "Train_1"}, "gke_cluster"),
        ({"platforms": ["gke"], **GKE, "gke_location": "mars"}, "gke_location"),
        ({"platforms": ["gke"], **GKE, "zones": ["europe-west4-a"]}, "zones: 'europe-west4-a'"),
        ({"platforms": ["gke"], **GKE, "gke_image": None}, "gke_image: required"),
        ({"platforms": ["gke"], **GKE, "gke_image": "img; rm -rf /"}, "gke_image"),
        ({"platforms": ["gke"], **GKE, "tpu_types": ["v6e-16"]}, "tpu_types: 'v6e-16' is not a single-host"),
        ({"platforms": ["gke"], **GKE, "workload_command": ["python", "job.py"]}, "workload_command: not supported"),
        ({"platforms": ["gke"], **GKE, "spot": True}, "spot: not supported"),
        ({"tpu_types": ["tpu7x-8"]}, "tpu_types: 'tpu7x-8' is TPU7x (Ironwood), provisioned on GKE only"),
        ({"tpu_image": "projects/x/global/images/$(reboot)"}, "tpu_image"),
        ({"tpu_types": ["tpu7x-12"], "platforms": ["gke"]}, "tpu_types: 'tpu7x-12': TPU7x types are tpu7x-N"),
    ],
)
def test_bad_input_is_refused_naming_the_param(params: dict[str, object], named: str) -> None:
    message = _refused(**params)
    assert named in message


def test_every_problem_is_reported_at_once() -> None:
    message = _refused(bucket="--help", train_steps=0, zones=["mars"])
    assert "bucket" in message and "train_steps" in message and "zones" in message


@pytest.mark.parametrize("value", ["vpc-a", "global/networks/vpc-a", "projects/my-proj/global/networks/vpc-a"])
def test_network_shapes_google_accepts(value: str) -> None:
    assert RunSpec.from_params({"network": value}, run_key="k").network == value


@pytest.mark.parametrize(
    "value", ["sa-train@my-project.iam.gserviceaccount.com", "123456789012-compute@developer.gserviceaccount.com"]
)
def test_service_account_shapes_google_accepts(value: str) -> None:
    assert RunSpec.from_params({"service_account": value}, run_key="k").service_account == value


@pytest.mark.parametrize("name", ["abc", "a_b-c", "interlude-local", "x" * 63])
def test_valid_bucket_names(name: str) -> None:
    assert bucket_problem(name) is None


def test_fields_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunSpec().bucket = "other"  # type: ignore[misc]


def test_no_run_param_dict_access_outside_runspec() -> None:
    """The spec dict from XCom is read only through RunSpec (templates of the generic sensor aside)."""
    import re

    names = "|".join(f.name for f in dataclasses.fields(RunSpec))
    pattern = re.compile(rf"""(spec|params)(\.get\(|\[)["']({names})["']""")
    offenders = []
    for path in [*(ROOT / "plugins").rglob("*.py"), *(ROOT / "dags").rglob("*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


def test_maintenance_policy_params_reach_the_policy() -> None:
    """Defaults are Google's figures (nothing overridden); a set param overrides its knob, the form's strings too."""
    from interlude.stage.notice_policy import MaintenanceKind, PolicyParams

    assert PolicyParams.from_mapping(RunSpec().policy_overrides()) == PolicyParams()
    spec = RunSpec.from_params(
        {"down_budget_seconds": "7200", "reprovision_margin_seconds": 30, "checkpoint_margin_commits": 2}
    )
    params = PolicyParams.from_mapping(spec.policy_overrides())
    assert params.budget(MaintenanceKind.GPU) == params.budget(MaintenanceKind.TPU_MULTI_HOST) == 7200.0
    assert params.budget(MaintenanceKind.SPOT) == 0.0
    assert (params.reprovision_margin_s, params.commit_margin_factor) == (30.0, 2.0)
