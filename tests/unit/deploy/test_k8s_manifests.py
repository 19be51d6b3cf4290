"""deploy/k8s/: every manifest validates against the Kubernetes schemas (offline, with the
pinned PyPI ``kubernetes-validate``), and the pieces that must agree do: probes, ports,
the ServiceMonitor's selector and port (issue 11)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30"  # the oldest release the manifests support
CRD_KINDS = {"ServiceMonitor"}  # Prometheus Operator: no built-in schema (checked below)


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for _f, d in _docs() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


@pytest.mark.parametrize(
    "doc",
    [d for _f, d in _docs() if d["kind"] not in CRD_KINDS],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_manifest_validates_strictly(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_validation_rejects_a_broken_manifest() -> None:
    """The check above can fail: a misspelled field and a wrong type are refused."""
    deployment = copy.deepcopy(_one("Deployment", "kafscale-broker"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    deployment = copy.deepcopy(_one("Deployment", "kafscale-broker"))
    deployment["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_existing_files() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        assert (K8S / res).is_file(), res


def _container() -> dict[str, Any]:
    spec = _one("Deployment", "kafscale-broker")["spec"]["template"]["spec"]
    return dict(spec["containers"][0])


def test_probes_point_at_the_broker_http_endpoint() -> None:
    c = _container()
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["livenessProbe"]["timeoutSeconds"] >= 1
    http_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KAFSCALE_HTTP"].rsplit(":", 1)[1] == str(http_port)


def test_service_monitor_selects_the_broker_service_and_its_metrics_port() -> None:
    sm = _one("ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    service = _one("Service", "kafscale")
    labels = service["metadata"]["labels"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    target = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    assert target["targetPort"] == "http"


def test_the_security_overlay_runs_one_worker_with_its_named_listeners() -> None:
    """``--workers`` above 1 with ``--listener`` is refused (broker/workers.py): the overlay
    that adds named listeners must bring the base's worker count back to one."""
    from broker.cli_broker import config_from_args
    from broker.workers import workers_for

    base = {e["name"]: e.get("value") for e in _one("Deployment")["spec"]["template"]["spec"][
        "containers"][0]["env"]}  # fmt: skip
    patch = yaml.safe_load((K8S / "security" / "broker-security.yaml").read_text())
    env = {**base}
    env.update({e["name"]: e.get("value") for e in patch["spec"]["template"]["spec"][
        "containers"][0]["env"]})  # fmt: skip
    assert env["KAFSCALE_WORKERS"] == "1" and "KAFSCALE_LISTENER" in env
    argv = [
        "--meta", "etcd://etcd:2379", "--workers", env["KAFSCALE_WORKERS"],
        *(a for item in env["KAFSCALE_LISTENER"].split(",") for a in ("--listener", item)),
    ]  # fmt: skip
    assert workers_for(argv, config_from_args(argv)[0]) == 1
