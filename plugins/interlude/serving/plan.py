"""One call from a ServeSpec to what would be applied: runtimes checked, manifests rendered and validated
(Kubernetes schemas, and the vLLM containers' `vllm serve` args against vLLM's parser or its flag table).

Why one call: `plan_only` must show exactly what `deploy` applies, so both paths take this plan; the
apply step sends `plan.objects` (server-side apply, in order) and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from interlude.serving.meta import Manifest
from interlude.serving.render import render_all, to_yaml
from interlude.serving.runtime_check import RuntimeReport, check_runtimes
from interlude.serving.spec import ServeSpec
from interlude.serving.tables import ServingTable, load_table
from interlude.serving.validate import KUBERNETES_VERSION, validate_all
from interlude.serving.vllm_args import deployment_problems


class ServingPlanError(ValueError):
    """The runtimes or the manifests are wrong; nothing was applied and retrying cannot help."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("serving plan refused:\n  - " + "\n  - ".join(problems))


@dataclass(frozen=True)
class ServingPlan:
    objects: tuple[Manifest, ...]
    text: str  # the YAML plan_only shows (byte-identical for the same spec and order)
    problems: tuple[str, ...]  # runtime errors + schema violations; empty when it may be applied
    runtime: RuntimeReport

    @property
    def ok(self) -> bool:
        return not self.problems


def plan(
    spec: ServeSpec,
    order: str = "tpu_first",
    *,
    table: ServingTable | None = None,
    gpu_driver: str | None = None,
    kubernetes_version: str = KUBERNETES_VERSION,
    scripts: Mapping[str, str] | None = None,
) -> ServingPlan:
    """Check both runtimes, render every object for `order`, validate them (problems collected, not raised).

    The spec must have passed `ServeSpec.check` (from_params does it); an unchecked one raises ServeSpecError.
    """
    table = table or load_table()
    runtime = check_runtimes(spec, table, gpu_driver=gpu_driver)
    objects = tuple(render_all(spec, order, table, scripts=scripts))
    vllm = [p for o in objects for p in deployment_problems(o)]  # would vLLM itself accept the args?
    problems = tuple(runtime.errors() + validate_all(objects, kubernetes_version) + vllm)
    return ServingPlan(objects, to_yaml(list(objects)), problems, runtime)


def require_plan(
    spec: ServeSpec,
    order: str = "tpu_first",
    *,
    table: ServingTable | None = None,
    gpu_driver: str | None = None,
    kubernetes_version: str = KUBERNETES_VERSION,
    scripts: Mapping[str, str] | None = None,
) -> ServingPlan:
    """`plan`, raising ServingPlanError (every problem, each naming its param or object) when not ok."""
    result = plan(
        spec, order, table=table, gpu_driver=gpu_driver, kubernetes_version=kubernetes_version, scripts=scripts
    )
    if not result.ok:
        raise ServingPlanError(list(result.problems))
    return result
