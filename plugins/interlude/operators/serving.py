"""Operators of the serving DAG, the Google provider's way: each calls a hook (GKEHook -> the cluster's
GKEKubernetesHook client -> KubeObjects); the waits defer to a trigger (one event) and execute_complete fails
loudly on anything but done. Decisions (what to apply, when a rollout is done, whether an answer proves the
checkpoint) are the pure functions of interlude.serving.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from interlude.operators.links import TimelineLink
from interlude.serving.spec import ServeSpec

if TYPE_CHECKING:  # the kubernetes client costs ~0.3 s to import: at run time, never at DAG parse
    from interlude.hooks.kube_objects import KubeObjects

#: The smoke request: a fixed prompt (never from a param), short, within any max_model_len the form allows.
SMOKE_PROMPT = "Interlude smoke test:"
SMOKE_MAX_TOKENS = 8


class ServingBaseOperator(BaseOperator):
    """Shared: the ServeSpec (from the resolve task's XCom) and the cluster it names.

    Subclasses add only ``execute``: each reaches the cluster through GKEHook, and each wait defers to a
    trigger with a wall-clock deadline and the spec's ``poll_seconds`` divided by the connection's
    ``time_scale`` (at least one second) between polls.

    :param spec: the ServeSpec as a dict; None pulls it from ``spec_task_id``'s XCom (templated).
    :param spec_task_id: the task whose XCom holds the ServeSpec.
    :param gcp_conn_id: the Google connection GKEHook reaches the spec's cluster through (credentials, project,
        the ``container_endpoint`` and ``time_scale`` extras).
    """

    template_fields = ("spec",)
    template_fields_renderers = {"spec": "json"}
    operator_extra_links = (TimelineLink(),)

    def __init__(
        self,
        *,
        spec: Any = None,
        spec_task_id: str = "resolve",
        gcp_conn_id: str = "google_cloud_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.spec_task_id = spec_task_id
        self.gcp_conn_id = gcp_conn_id

    def serve_spec(self, context: Any) -> ServeSpec:
        if self.spec is None:
            self.spec = context["ti"].xcom_pull(task_ids=self.spec_task_id)
        return ServeSpec.from_dict(self.spec)

    def gke_hook(self, spec: ServeSpec) -> Any:
        from interlude.hooks.gke import GKEHook

        return GKEHook(gcp_conn_id=self.gcp_conn_id, location=spec.location)

    @contextmanager
    def objects(self, spec: ServeSpec) -> Iterator[KubeObjects]:
        hook = self.gke_hook(spec)
        kube = hook.kubernetes_hook(spec.cluster, project_id=hook.project_id)
        from interlude.hooks.kube_objects import KubeObjects

        with kube.get_conn() as api_client:
            yield KubeObjects(api_client)

    def trigger_kwargs(self, spec: ServeSpec, timeout_seconds: float) -> dict[str, Any]:
        """Deadline in wall-clock seconds (pods start in real time, also on the local cloud); polls follow the
        connection's clock (`time_scale`: the local cloud runs faster than Google's), at most once a second."""
        hook = self.gke_hook(spec)
        scale = float(hook._get_field("time_scale", None) or 1.0)
        return {
            "gcp_conn_id": self.gcp_conn_id,
            "project_id": hook.project_id,
            "location": spec.location,
            "cluster": spec.cluster,
            "namespace": spec.namespace,
            "name": spec.name,
            "deadline": time.time() + timeout_seconds,
            "poll_interval": max(1.0, spec.poll_seconds / scale),
        }


def _fail_unless_done(event: dict[str, Any] | None, what: str) -> dict[str, Any]:
    if not event or event.get("status") != "done":
        status = (event or {}).get("status", "no event")
        detail = (event or {}).get("message") or (event or {}).get("reason") or ""
        raise AirflowException(
            f"{what} {status}: {detail} (pods: {(event or {}).get('pods') or (event or {}).get('left')})"
        )
    return event


class ServingApplyOperator(ServingBaseOperator):
    """Server-side apply the plan's objects in order; returns each object's outcome (created/configured/unchanged).

    The plan is re-made here from the spec (pure and deterministic: the same YAML the plan task showed), so
    what is applied is exactly what plan_only shows.

    :param spec: the ServeSpec as a dict; None pulls it from ``spec_task_id``'s XCom (templated).
    :param spec_task_id: the task whose XCom holds the ServeSpec.
    :param gcp_conn_id: the Google connection GKEHook reaches the spec's cluster through (credentials, project,
        the ``container_endpoint`` and ``time_scale`` extras).
    """

    ui_color = "#d1e7dd"

    def execute(self, context: Any) -> dict[str, Any]:
        from interlude.operators.serving_records import snapshot
        from interlude.serving.entrypoints import load_scripts
        from interlude.serving.plan import require_plan

        spec = self.serve_spec(context)
        result = require_plan(spec, scripts=load_scripts())
        started_at = time.time()
        applied = []
        with self.objects(spec) as kube:
            before = snapshot(kube.api_client, spec.namespace, spec.name)  # the report counts from here
            for manifest in result.objects:
                done = kube.apply(manifest)
                self.log.info("%s %s/%s: %s", done.kind, done.namespace or "-", done.name, done.outcome)
                applied.append(done.to_dict())
        changed = [a for a in applied if a["outcome"] != "unchanged"]
        self.log.info("Applied %d objects, %d created or changed", len(applied), len(changed))
        return {"started_at": started_at, "applied": applied, "changed": len(changed), **before}


class ServingRolloutOperator(ServingBaseOperator):
    """Defer until the Deployment's newest template is fully Ready (or the spec's rollout timeout passes).

    ``rollout_timeout_seconds`` is wall-clock time. Pods pending on a TPU stockout may be moved to GPU (and
    back) by re-applying the ComputeClass order; each such decision is logged and returned in ``fallbacks``.

    :param spec: the ServeSpec as a dict; None pulls it from ``spec_task_id``'s XCom (templated).
    :param spec_task_id: the task whose XCom holds the ServeSpec.
    :param gcp_conn_id: the Google connection GKEHook reaches the spec's cluster through (credentials, project,
        the ``container_endpoint`` and ``time_scale`` extras).
    """

    ui_color = "#fff3cd"

    def execute(self, context: Any) -> None:
        from interlude.serving.fallback import FallbackState

        spec = self.serve_spec(context)
        kwargs = self.trigger_kwargs(spec, spec.rollout_timeout_seconds)
        self._defer(spec, kwargs, FallbackState("tpu_first", time.time(), self._time_scale(spec)))

    def _time_scale(self, spec: ServeSpec) -> float:
        return float(self.gke_hook(spec)._get_field("time_scale", None) or 1.0)

    def _defer(self, spec: ServeSpec, kwargs: dict[str, Any], state: Any) -> None:
        from interlude.triggers.serving import RolloutTrigger

        fallback = {"state": state.to_dict(), "spec": spec.to_dict()}
        self.defer(trigger=RolloutTrigger(fallback=fallback, **kwargs), method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        from interlude.serving.fallback import FallbackState

        if event and event.get("status") == "fallback":
            self._fall_back(context, event)  # defers again
        done = _fail_unless_done(event, "rollout")
        self.log.info("Rollout complete: %s", done["reason"])
        for pod in done["pods"]:
            self.log.info("pod %s on %s (%s) ready=%s", pod["name"], pod["node"], pod["accelerator"], pod["ready"])
        state = done.pop("fallback_state", None)
        done["fallbacks"] = list(FallbackState.from_dict(state).records) if state else []
        return done

    def _fall_back(self, context: Any, event: dict[str, Any]) -> None:
        """Apply the decided ComputeClass order (class only: no Deployment change, no rollout), log the
        decision with its reason, keep it for the report, and wait for the rollout again."""
        from interlude.serving.fallback import FallbackState
        from interlude.serving.policy import FallbackPlan
        from interlude.serving.render import compute_class

        spec = self.serve_spec(context)
        raw = event["plan"]
        plan = FallbackPlan(raw["action"], raw["order"], raw["reason"], tuple(raw.get("stuck_pods") or ()))
        state = FallbackState.from_dict(event["fallback_state"])
        with self.objects(spec) as kube:
            done = kube.apply(compute_class(spec, plan.order))
        state = state.after(plan, time.time())
        self.log.warning(
            "Fallback decision: %s -> ComputeClass %s %s (%s); reason: %s; pods: %s",
            plan.action,
            spec.name,
            plan.order,
            done.outcome,
            plan.reason,
            ", ".join(plan.stuck_pods) or "-",
        )
        kwargs = {**self.trigger_kwargs(spec, spec.rollout_timeout_seconds), "deadline": float(event["deadline"])}
        self._defer(spec, kwargs, state)


class ServingDeleteOperator(ServingBaseOperator):
    """Delete every object the spec renders (object_refs order), then defer until none is left.

    The wait ends when no pod, Service or ComputeClass of the spec remains, or fails after the spec's
    ``rollout_timeout_seconds`` (wall-clock). An object already gone is logged, not an error.

    :param spec: the ServeSpec as a dict; None pulls it from ``spec_task_id``'s XCom (templated).
    :param spec_task_id: the task whose XCom holds the ServeSpec.
    :param gcp_conn_id: the Google connection GKEHook reaches the spec's cluster through (credentials, project,
        the ``container_endpoint`` and ``time_scale`` extras).
    """

    ui_color = "#f8d7da"

    def execute(self, context: Any) -> None:
        from interlude.serving.render import object_refs
        from interlude.triggers.serving import DeletedTrigger

        spec = self.serve_spec(context)
        with self.objects(spec) as kube:
            for ref in object_refs(spec):
                gone = kube.delete(ref)
                self.log.info("%s %s/%s: %s", ref[1], ref[2] or "-", ref[3], "deleted" if gone else "not there")
        self.defer(
            trigger=DeletedTrigger(**self.trigger_kwargs(spec, spec.rollout_timeout_seconds)),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        done = _fail_unless_done(event, "delete")
        self.log.info("Deleted: %s", done["reason"])
        return done


class ServingSmokeOperator(ServingBaseOperator):
    """One completion through the Service (the API server's Service proxy), proving what is served.

    Fails without retry unless the answer comes from the served model and ``/v1/models`` names the spec's
    checkpoint (or a step under it) as its root; returns the root, the text, the fingerprint and the latency in seconds.

    :param spec: the ServeSpec as a dict; None pulls it from ``spec_task_id``'s XCom (templated).
    :param spec_task_id: the task whose XCom holds the ServeSpec.
    :param gcp_conn_id: the Google connection GKEHook reaches the spec's cluster through (credentials, project,
        the ``container_endpoint`` and ``time_scale`` extras).
    """

    def execute(self, context: Any) -> dict[str, Any]:
        from interlude.serving.loading import served_roots
        from interlude.serving.rollout import smoke_problems
        from interlude.serving.tables import load_table

        spec = self.serve_spec(context)
        assert spec.checkpoint_uri is not None  # resolve refuses deploy without one
        body = {  # temperature 0: greedy, so the answer is the model's own (vLLM samples at 1.0 by default)
            "model": spec.served_model_name,
            "prompt": SMOKE_PROMPT,
            "max_tokens": SMOKE_MAX_TOKENS,
            "temperature": 0,
        }
        with self.objects(spec) as kube:
            models = kube.service_call(spec.namespace, spec.name, "v1/models")
            started = time.monotonic()
            completion = kube.service_call(spec.namespace, spec.name, "v1/completions", body)
            latency = time.monotonic() - started
        roots = served_roots(spec, load_table())  # the gs:// URI (streamer) or the FUSE mount of it
        problems = smoke_problems(models, completion, spec.served_model_name, spec.checkpoint_uri, roots)
        if problems:
            raise AirflowFailException("smoke test failed:\n  - " + "\n  - ".join(problems))
        root = next(m["root"] for m in models["data"] if m["id"] == spec.served_model_name)
        text = completion["choices"][0]["text"]
        fingerprint = completion.get("system_fingerprint")
        self.log.info("Service answered %r from %s (fingerprint %s) in %.3f s", text, root, fingerprint, latency)
        return {"root": root, "text": text, "fingerprint": fingerprint, "latency_seconds": latency}
