"""The two routes by which values add TEMPERED_* variables, `settings:` (the ConfigMap) and a
worker's `env:` (workers.<queue>.env, defaults.env), against the names the chart writes.

A `settings:` entry of one was written twice in the ConfigMap, the later, `settings:`'s, won;
a container's `env` wins over its `envFrom`, so a worker's `env:` naming one overrode the
ConfigMap's key: either passed what the chart derives from its value (the sandbox quota check
on concurrency, the sandbox namespace's Role, the state dir's mount, the metrics ports).
The chart also sets names in the pod itself (TEMPERED_WORKER_ID, each pod's own name, by which
sessions are routed; the workspace sessions' root and disk): one in `env:` named the
container's variable twice. Rendering refuses every name of tempered.chartSettings
(templates/_settings.tpl) on both routes, naming the value to set instead, but the ones the
chart itself yields to a worker's own env (the learner's TEMPERED_LEARNER__RANKS). Skipped
without helm.
"""

from __future__ import annotations

import pytest
import yaml

from tests.charts.chart import (
    CHART,
    container,
    deployments,
    needs_helm,
    objects,
    refused,
    render,
)
from tests.charts.settings_schema import settings_names

pytestmark = needs_helm

YIELDED = {"TEMPERED_INFERENCE__LOCAL__DEVICE", "TEMPERED_LEARNER__DEVICE"}
"""Written in the pod only where neither `env:` nor `settings:` names them (torch's device,
tempered.deviceSettings: test_chart_values.py)."""


@pytest.mark.parametrize(
    ("item", "how"),
    [
        # workers.sandbox.env.TEMPERED_SANDBOX__CONCURRENCY=200 once rendered: the quota check
        # used sandbox.concurrency (16) while the worker ran 200 Jobs at once, with no Role
        ("workers.sandbox.env.TEMPERED_SANDBOX__CONCURRENCY=200", "set sandbox.concurrency"),
        (
            "workers.sandbox.env.TEMPERED_SANDBOX__KUBERNETES__NAMESPACE=other",
            "set sandbox.namespace",
        ),
        ("workers.rewards.env.TEMPERED_HOME=/elsewhere", "set stateDir"),
        ("defaults.env.TEMPERED_S3__BUCKET=other", "set s3.bucket"),
        ("workers.inference.env.TEMPERED_LEARNER__RANKS=2", "set workers.learner.gpu"),
        ("defaults.env.TEMPERED_LEARNER__RANKS=2", "set workers.learner.gpu"),
        ("settings.TEMPERED_SANDBOX__CONCURRENCY=64", "set sandbox.concurrency"),
        ("settings.TEMPERED_HOME=/elsewhere", "set stateDir"),
        ("settings.TEMPERED_SANDBOX__KUBERNETES__NAMESPACE=other", "set sandbox.namespace"),
        ("settings.TEMPERED_TELEMETRY__PROMETHEUS_PORT=9000", "set telemetry.prometheus.basePort"),
        # each pod's name: in `env:`, every pod of the Deployment had one id (or the pod's, as
        # the client merged the name given twice), and sessions are routed by worker id
        ("workers.sandbox.env.TEMPERED_WORKER_ID=w1", "each pod's own name"),
        ("defaults.env.TEMPERED_WORKER_ID=w1", "each pod's own name"),
        # the sessions' emptyDir and its tmpfs workspaces (sandbox.workspaceSessions)
        (
            "workers.sandbox.env.TEMPERED_SANDBOX__WORKSPACES__ROOT=/data",
            "the chart sets it with sandbox.workspaceSessions.enabled",
        ),
        (
            "defaults.env.TEMPERED_SANDBOX__WORKSPACES__DISK=directory",
            "set sandbox.workspaceSessions.disk instead (tmpfs or directory",
        ),
        (
            "settings.TEMPERED_SANDBOX__WORKSPACES__ROOT=/data",
            "the chart sets it with sandbox.workspaceSessions.enabled",
        ),
    ],
)
def test_a_route_may_not_name_what_the_chart_writes(item: str, how: str) -> None:
    """The refusal names the route and the name (`<route>.<NAME>`) and what to do instead."""
    refusal = refused(item, "sandbox.workspaceSessions.enabled=true")
    assert f"{item.split('=')[0]} is written by the chart: {how}" in refusal, refusal


def written_by_the_chart() -> list[str]:
    """Every TEMPERED_* name the chart writes, each optional one rendered: the ConfigMap's and
    the Secret's keys, and those of each worker container's own env (the learner's ranks, the
    pod's worker id, the workspace sessions' root and disk)."""
    docs = render(
        None,
        "temporal.buildId=b7",
        "sandbox.runtimeClass.name=gvisor",
        "telemetry.otlpEndpoint=http://otel-collector:4317",
        "sandbox.workspaceSessions.enabled=true",
        "sandbox.concurrency=1",  # 1 x (4096 + 2 x 64 + 256) MB: test_chart_fix60_sessions_memory.py
        "workers.sandbox.resources.limits.memory=5Gi",
    )
    (configmap,) = objects(docs, "ConfigMap").values()
    (secret,) = objects(docs, "Secret").values()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    given = {*values["defaults"]["env"]}
    given |= {name for worker in values["workers"].values() for name in worker.get("env") or {}}
    in_pods = {e["name"] for d in deployments(docs).values() for e in container(d)["env"]}
    names = {*configmap["data"], *secret["stringData"], *(in_pods - given - YIELDED)}
    return sorted(n for n in names if n.startswith("TEMPERED_"))


@pytest.mark.parametrize("route", ["settings", "workers.agent-tasks.env", "defaults.env"])
def test_every_name_the_chart_writes_is_refused(route: str) -> None:
    """On each route, but a `settings:` name the schema refuses first (TEMPERED_WORKER_ID is no
    setting of the model: test_chart_values.py)."""
    written = written_by_the_chart()
    assert {"TEMPERED_WORKER_ID", "TEMPERED_LEARNER__RANKS"} < set(written), written
    assert {"TEMPERED_SANDBOX__WORKSPACES__ROOT", "TEMPERED_SANDBOX__WORKSPACES__DISK"} < set(
        written
    )
    if route == "settings":
        written = [n for n in written if n in settings_names()]
    refusal = refused(*(f"{route}.{name}=1" for name in written))
    assert [n for n in written if f"{route}.{n} is written by the chart" not in refusal] == []


def test_a_setting_the_chart_does_not_write_is_taken() -> None:
    assert render(None, "settings.TEMPERED_SANDBOX__WORKSPACES__MAX_WORKSPACE_MB=64")


def test_a_disabled_worker_env_is_not_refused() -> None:
    """Nothing of a disabled worker renders: its env reaches no pod."""
    docs = render(
        None,
        "workers.rewards.enabled=false",
        "workers.rewards.env.TEMPERED_SANDBOX__CONCURRENCY=200",
    )
    assert "rewards" not in deployments(docs)


def test_the_learner_env_may_name_its_ranks() -> None:
    """The chart writes TEMPERED_LEARNER__RANKS (from gpu) only where the learner's env does not:
    the one name a worker's env may set of those the chart writes."""
    docs = render(None, "workers.learner.env.TEMPERED_LEARNER__RANKS=2")
    env = {e["name"]: e.get("value") for e in container(deployments(docs)["learner"])["env"]}
    assert env["TEMPERED_LEARNER__RANKS"] == "2"
    refusal = refused(
        "defaults.env.TEMPERED_LEARNER__RANKS=2",
        "workers.agent-tasks.enabled=false",
        "workers.inference.enabled=false",
        "workers.sandbox.enabled=false",
    )
    assert "defaults.env.TEMPERED_LEARNER__RANKS is written by the chart" in refusal  # rewards'
