"""The opt-in policies of the worker pods: a PodDisruptionBudget per worker (`pdb`) and an
egress NetworkPolicy per worker (`networkPolicy`: DNS, Temporal, S3, and the API server for
the sandbox worker only). Every ci values file is rendered and validated (strict, 1.33) by
tests/charts/test_chart.py; this checks what the objects select and allow. Skipped without
helm.
"""

from __future__ import annotations

from typing import Any

from tests.charts.chart import (
    CHART,
    WORKERS,
    deployments,
    needs_helm,
    objects,
    refused,
    render,
)

pytestmark = needs_helm

POLICIES = CHART / "ci" / "policies-values.yaml"


def _selects(selector: dict[str, Any], deployment: dict[str, Any]) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_no_pdb_or_worker_network_policy_unless_asked() -> None:
    docs = render()
    assert not objects(docs, "PodDisruptionBudget")
    assert [d["metadata"]["namespace"] for d in objects(docs, "NetworkPolicy").values()] == [
        "tempered-sandbox"
    ]


def test_a_pdb_selects_exactly_its_workers_pods() -> None:
    docs = render(POLICIES)
    budgets = objects(docs, "PodDisruptionBudget").values()
    workers = deployments(docs)
    assert {b["metadata"]["labels"]["tempered.dev/queue"] for b in budgets} == {
        "inference",
        "sandbox",
    }
    for budget in budgets:
        queue = budget["metadata"]["labels"]["tempered.dev/queue"]
        chosen = [q for q, d in workers.items() if _selects(budget["spec"]["selector"], d)]
        assert chosen == [queue]
    by_queue = {b["metadata"]["labels"]["tempered.dev/queue"]: b["spec"] for b in budgets}
    assert by_queue["inference"]["maxUnavailable"] == 1
    assert by_queue["sandbox"]["minAvailable"] == 1


def test_a_pdb_takes_one_of_min_available_or_max_unavailable() -> None:
    refusal = refused(
        "workers.inference.pdb.enabled=true",
        "workers.inference.pdb.minAvailable=1",
        "workers.inference.pdb.maxUnavailable=1",
    )
    assert "pdb" in refusal and "minAvailable" in refusal


def test_the_worker_egress_policy_allows_dns_temporal_s3_and_the_api_server() -> None:
    docs = render(POLICIES)
    policies = [
        p for p in objects(docs, "NetworkPolicy").values() if "namespace" not in p["metadata"]
    ]  # the release namespace's
    workers = deployments(docs)
    assert {p["metadata"]["labels"]["tempered.dev/queue"] for p in policies} == set(WORKERS)
    for policy in policies:
        queue = policy["metadata"]["labels"]["tempered.dev/queue"]
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Egress"]
        assert [q for q, d in workers.items() if _selects(spec["podSelector"], d)] == [queue]
        ports = {
            (p.get("protocol", "TCP"), p["port"]) for rule in spec["egress"] for p in rule["ports"]
        }
        assert {("UDP", 53), ("TCP", 53), ("TCP", 7233), ("TCP", 8333)} <= ports, queue
        assert ("TCP", 443) in ports if queue == "sandbox" else ("TCP", 443) not in ports, queue
