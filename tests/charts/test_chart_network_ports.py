"""The worker egress policy's ports are the pods' (a NetworkPolicy sees the destination after
the Service's DNAT): `networkPolicy.s3.port` and `temporal.port` override the Service URLs'
ports (a MinIO tenant's Service on 80 forwards to pods on 9000), and `dns` reaches NodeLocal
DNSCache (`extraTo`) and DNS pods on other ports (`ports`: OpenShift's 5353). Every ci values
file, ci/network-ports-values.yaml among them, is rendered and validated (strict, 1.33) by
tests/charts/test_chart.py. Skipped without helm.
"""

from __future__ import annotations

from typing import Any

from tests.charts.chart import CHART, needs_helm, objects, render

pytestmark = needs_helm

PORTS = CHART / "ci" / "network-ports-values.yaml"


def _egress(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each worker's egress rules, by queue (the release namespace's policies)."""
    return {
        p["metadata"]["labels"]["tempered.dev/queue"]: p["spec"]["egress"]
        for p in objects(docs, "NetworkPolicy").values()
        if "namespace" not in p["metadata"]
    }


def _ports(rules: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for rule in rules for p in rule["ports"]}


def test_s3_and_temporal_take_the_pods_ports_where_set() -> None:
    for queue, rules in _egress(render(PORTS)).items():
        ports = _ports(rules)
        assert {("TCP", 9000), ("TCP", 7233)} <= ports, queue
        assert ("TCP", 80) not in ports, queue  # the Services' ports, never the pods'


def test_without_a_port_the_urls_port_is_used() -> None:
    docs = render(None, "networkPolicy.enabled=true")
    for queue, rules in _egress(docs).items():
        assert {("TCP", 8333), ("TCP", 7233)} <= _ports(rules), queue


def test_dns_reaches_node_local_dns_and_other_ports() -> None:
    for queue, rules in _egress(render(PORTS)).items():
        (dns,) = [r for r in rules if ("UDP", 53) in _ports([r])]
        assert _ports([dns]) == {(p, n) for p in ("UDP", "TCP") for n in (53, 5353)}, queue
        assert {"ipBlock": {"cidr": "169.254.20.10/32"}} in dns["to"], queue
        assert any("podSelector" in peer for peer in dns["to"]), queue  # kube-dns kept


def test_dns_defaults_to_kube_dns_on_53() -> None:
    for queue, rules in _egress(render(None, "networkPolicy.enabled=true")).items():
        (dns,) = [r for r in rules if ("UDP", 53) in _ports([r])]
        assert _ports([dns]) == {("UDP", 53), ("TCP", 53)}, queue
        assert dns["to"] == [
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
        ], queue
