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


def _workers() -> int:
    env = {e["name"]: e.get("value") for e in _container()["env"]}
    return int(env["KAFSCALE_WORKERS"])


def test_service_monitor_scrapes_every_worker_of_a_pod() -> None:
    """Each worker serves its own /metrics on the HTTP port + its index: the ServiceMonitor
    needs one endpoint per worker, through a Service port that reaches it, and a distinct
    ``instance`` per worker (pod and port name) so that their series do not collide."""
    sm = _one("ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    service = _one("Service", "kafscale")
    labels = service["metadata"]["labels"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container_ports = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    service_ports = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    scraped = set()
    for endpoint in sm["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics"
        scraped.add(container_ports[service_ports[endpoint["port"]]])
        (relabel,) = endpoint["relabelings"]
        assert relabel["targetLabel"] == "instance"
        assert "__meta_kubernetes_endpoint_port_name" in relabel["sourceLabels"]
    assert scraped == {container_ports["http"] + i for i in range(_workers())}


def test_the_security_overlay_gives_every_worker_its_listeners(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With named listeners each worker serves every port + its index: the overlay's
    listeners must not collide between the base's workers (``plan_workers`` refuses that),
    and the container must declare every worker's port."""
    from broker.cli_broker import config_from_args
    from broker.workers import bound_ports, plan_workers, shift_ports, workers_for

    patch = yaml.safe_load((K8S / "security" / "broker-security.yaml").read_text())
    patched = patch["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in _container()["env"]}
    env.update({e["name"]: e.get("value") for e in patched["env"]})
    secrets = (K8S / "security" / "secrets.yaml").read_text()
    for doc in yaml.safe_load_all(secrets):
        if doc and doc["kind"] == "ConfigMap":  # envFrom: the OAuth settings
            env.update(doc["data"])
    assert "KAFSCALE_LISTENER" in env
    for name, value in env.items():
        if name.startswith("KAFSCALE_") and value is not None:
            monkeypatch.setenv(name, value.replace("$(POD_IP)", "10.0.0.7"))
    monkeypatch.delenv("KAFSCALE_NODE_ID", raising=False)
    meta = ["--meta", "etcd://etcd:2379"]  # the base's kafscale-store ConfigMap
    config, _ = config_from_args(meta)
    n = workers_for(meta, config)
    assert n == _workers() > 1
    plans = plan_workers(n, config)
    declared = {p["containerPort"] for p in _container()["ports"] + patched["ports"]}
    for plan in plans:
        worker, _ = config_from_args([*meta, *plan.args()])
        assert set(bound_ports(worker)) - {9092 + plan.index} <= declared  # 9092+i: localhost
        assert bound_ports(worker) == bound_ports(shift_ports(config, plan.index))


def _all_docs() -> list[dict[str, Any]]:
    """The base's documents and the security overlay's."""
    docs = [d for _f, d in _docs()]
    for path in sorted((K8S / "security").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _variables(container: dict[str, Any], docs: list[dict[str, Any]]) -> set[str]:
    """The ``KAFSCALE_*`` variables a container is given: ``env`` and ``envFrom``."""
    names = {e["name"] for e in container.get("env", [])}
    for ref in container.get("envFrom", []):
        kind, name = (
            ("ConfigMap", "configMapRef") if "configMapRef" in ref else ("Secret", "secretRef")
        )
        (source,) = [
            d for d in docs if d["kind"] == kind and d["metadata"]["name"] == ref[name]["name"]
        ]
        names |= set(source.get("data", {})) | set(source.get("stringData", {}))
    return {n for n in names if n.startswith("KAFSCALE_")}


def test_every_variable_a_workload_gets_is_a_setting_of_its_command() -> None:
    """A misspelt variable would be ignored (with one warning in the log): each one the
    manifests give the broker (the base and the security overlay's patch) and the ingest
    job must be a flag's variable of the command the container runs."""
    from broker.cli_broker import broker_parser
    from ingest_job.cli import ingest_parser

    docs = _all_docs()
    given: dict[str, set[str]] = {"broker": set(), "ingest": set()}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "CronJob"):
            continue
        pod = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
        spec = pod["template"]["spec"]
        for c in spec["containers"]:
            run = " ".join(c.get("command", []) + c.get("args", []))
            command = "ingest" if "kafscale ingest" in run else "broker"  # the patch: no command
            assert doc["metadata"]["name"] == "kafscale-broker" or command == "ingest", run
            given[command] |= _variables(c, docs)
    assert {"KAFSCALE_STORE", "KAFSCALE_WORKERS", "KAFSCALE_ETCD_PASSWORD"} <= given["broker"]
    assert {"KAFSCALE_STORE", "KAFSCALE_TOPICS"} <= given["ingest"]
    assert given["broker"] - broker_parser().variables() == set()
    assert given["ingest"] - ingest_parser().variables() == set()
