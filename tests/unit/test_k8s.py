"""infra/k8s stays valid and in step with the services, offline.

* Every built-in object validates against the Kubernetes OpenAPI schemas shipped in
  ``kubernetes-validate`` (strict: unknown fields fail), for the oldest and the newest
  version we claim; the ServiceMonitors (a CRD) are checked structurally here.
* Every ``LORAPLANE_*`` variable a container sets is a field of its service's settings
  class, and the values it sets load into that class (types and cross-field validators),
  as tests/unit/test_compose.py does for compose; ports, probes, Services and
  ServiceMonitors agree with them.
* The NetworkPolicies are evaluated for the flows the platform needs (derived from the
  settings each workload sets) and for the ones that must stay closed: tenants reach only
  the gateway, only the workers and admission reach the object store.
* Secrets are referenced, never valued.
"""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from loraplane.stack.services import SERVICES

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra/k8s"
KUSTOMIZATION = yaml.safe_load((K8S / "kustomization.yaml").read_text())
NAMESPACE = KUSTOMIZATION["namespace"]
TEMPLATES = sorted(K8S.glob("*.template.yaml"))
MANIFESTS = sorted(p for p in K8S.glob("*.yaml")
                   if p.name != "kustomization.yaml" and p not in TEMPLATES)
K8S_VERSIONS = ("1.30.0", "1.37.0")
"""Oldest and newest Kubernetes the manifests are checked against (gRPC probes GA 1.27,
autoscaling/v2 and policy/v1 long before)."""
IMAGE_UID = 10001
"""The numeric USER of infra/docker/Dockerfile and Dockerfile.worker."""
SPECS = {spec.name: spec for spec in SERVICES}
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
SENSITIVE = re.compile(r"_TOKEN$|SECRET|PASSW|DSN|ACCESS_KEY")


def _load(paths: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, doc) for p in paths for doc in yaml.safe_load_all(p.read_text()) if doc]


DOCS = _load(MANIFESTS)
SECRET_TEMPLATES = {d["metadata"]["name"]: d for _, d in _load(TEMPLATES) if d["kind"] == "Secret"}


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == kind}


def workloads() -> dict[str, dict[str, Any]]:
    """Workload name -> object, for every Deployment, StatefulSet and Job."""
    out: dict[str, dict[str, Any]] = {}
    for kind in WORKLOAD_KINDS:
        out.update(objects(kind))
    return out


def pod_spec(workload: Mapping[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def pod_labels(workload: Mapping[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def service_of(workload: Mapping[str, Any]) -> str:
    return pod_labels(workload)["app.kubernetes.io/name"]


def main_container(workload: Mapping[str, Any]) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1, f"{workload['metadata']['name']}: one container expected"
    return containers[0]  # type: ignore[no-any-return]


def env_of(container: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    entries = container.get("env", [])
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), f"{container['name']}: a variable set twice"
    assert "envFrom" not in container, "name every variable (envFrom hides them from this test)"
    return {e["name"]: e for e in entries}


def literal(env: Mapping[str, dict[str, Any]], name: str) -> str:
    value = env[name].get("value")
    assert isinstance(value, str), f"{name} is not a literal value"
    return value


def container_ports(container: Mapping[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


# --- settings (as tests/unit/test_compose.py) ---------------------------------------------


def _env_names(cls: type[BaseSettings]) -> set[str]:
    prefix = str(cls.model_config.get("env_prefix", "")).upper()
    names = set()
    for field_name, field in cls.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {c.upper() for c in alias.choices if isinstance(c, str)}
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(prefix + field_name.upper())
    return names


def settings_classes(service: str) -> list[type[BaseSettings]]:
    """The service's settings class(es) (clients' settings excluded)."""
    package = SPECS[service].module.removesuffix(".__main__")
    found: list[type[BaseSettings]] = []
    for mod_name in (f"{package}.settings", f"{package}.config"):
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError:
            continue
        found += [obj for _, obj in inspect.getmembers(mod, inspect.isclass)
                  if issubclass(obj, BaseSettings) and obj.__module__ == mod.__name__
                  and "Client" not in obj.__name__]
    assert found, f"{package} has no settings class"
    return found


def migrate_env_names() -> set[str]:
    """``loraplane db migrate`` reads the DSN only (loraplane.cli.db)."""
    return {"LORAPLANE_POSTGRES_DSN"}


def known_env(workload: Mapping[str, Any]) -> set[str]:
    service = service_of(workload)
    if service == "migrate":
        return migrate_env_names()
    return set().union(*(_env_names(cls) for cls in settings_classes(service)))


def resolved_env(workload: Mapping[str, Any]) -> dict[str, str]:
    """The container's variables as a pod would see them: literals, ConfigMap values,
    a stand-in for fieldRefs and Secrets (which have no value here)."""
    configmaps = objects("ConfigMap")
    out: dict[str, str] = {}
    for name, entry in env_of(main_container(workload)).items():
        source = entry.get("valueFrom", {})
        if "value" in entry:
            out[name] = entry["value"]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            out[name] = configmaps[ref["name"]]["data"][ref["key"]]
        elif "fieldRef" in source:
            out[name] = {"metadata.name": f"{workload['metadata']['name']}-0",
                         "status.podIP": "10.0.0.7"}[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            out[name] = "s" * 32  # a valid-looking secret (the operator token needs >= 16)
        else:
            raise AssertionError(f"{name}: unsupported valueFrom {source}")
    return out


# --- schema validation ---------------------------------------------------------------------


def test_kustomization_lists_every_manifest_and_no_template() -> None:
    resources = set(KUSTOMIZATION["resources"])
    assert resources == {p.name for p in MANIFESTS}, "kustomization.yaml and the files disagree"
    assert not resources & {p.name for p in TEMPLATES}, "a template would blank real Secrets"
    images = {main_container(w)["image"].split(":")[0] for w in workloads().values()}
    assert images == {i["name"] for i in KUSTOMIZATION["images"]}
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", i["newTag"]) for i in KUSTOMIZATION["images"])


BUILTIN = [(f, d) for f, d in DOCS + _load(TEMPLATES) if "monitoring.coreos.com" not in d["apiVersion"]]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("path", "doc"), BUILTIN,
                         ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in BUILTIN])
def test_builtin_objects_validate_against_the_schemas(path: str, doc: dict[str, Any],
                                                      version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        pytest.fail(f"{path} {doc['kind']}/{doc['metadata']['name']} at "
                    f"{'.'.join(map(str, err.path))}: {err.message}")


def test_schema_validation_catches_a_wrong_field() -> None:
    deployment = objects("Deployment")["gateway"]
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["imagee"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


SERVICE_MONITOR_SPEC = {"jobLabel", "selector", "namespaceSelector", "endpoints"}
SERVICE_MONITOR_ENDPOINT = {"port", "path", "interval", "scrapeTimeout", "scheme"}
DURATION = re.compile(r"^\d+(ms|s|m|h)$")


def check_service_monitor(doc: Mapping[str, Any]) -> list[str]:
    """Structural problems of a ServiceMonitor (the CRD's required shape, the fields used)."""
    problems = []
    if doc.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append(f"apiVersion {doc.get('apiVersion')}")
    if set(doc) - {"apiVersion", "kind", "metadata", "spec"}:
        problems.append(f"unknown top-level fields {set(doc) - {'apiVersion', 'kind', 'metadata', 'spec'}}")
    spec = doc.get("spec", {})
    if set(spec) - SERVICE_MONITOR_SPEC:
        problems.append(f"unknown spec fields {set(spec) - SERVICE_MONITOR_SPEC}")
    labels = spec.get("selector", {}).get("matchLabels")
    if not isinstance(labels, dict) or not labels:
        problems.append("spec.selector.matchLabels missing")
    names = spec.get("namespaceSelector", {}).get("matchNames", [NAMESPACE])
    if NAMESPACE not in names:
        problems.append(f"namespaceSelector misses {NAMESPACE}")
    endpoints = spec.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        problems.append("spec.endpoints missing")
    for ep in endpoints or []:
        if set(ep) - SERVICE_MONITOR_ENDPOINT:
            problems.append(f"unknown endpoint fields {set(ep) - SERVICE_MONITOR_ENDPOINT}")
        if not isinstance(ep.get("port"), str):
            problems.append("endpoint.port must name a Service port")
        if not str(ep.get("path", "/metrics")).startswith("/"):
            problems.append(f"endpoint.path {ep.get('path')}")
        for key in ("interval", "scrapeTimeout"):
            if key in ep and not DURATION.match(str(ep[key])):
                problems.append(f"endpoint.{key} {ep[key]}")
    return problems


def test_every_service_has_a_valid_service_monitor_on_its_metrics_port() -> None:
    monitors = objects("ServiceMonitor")
    services = objects("Service")
    assert set(monitors) == set(SPECS), "one ServiceMonitor per service"
    for name, monitor in monitors.items():
        assert not check_service_monitor(monitor), (name, check_service_monitor(monitor))
        selector = monitor["spec"]["selector"]["matchLabels"]
        port_names = {ep["port"] for ep in monitor["spec"]["endpoints"]}
        scraped = [svc for svc in services.values()
                   if selector.items() <= svc["metadata"].get("labels", {}).items()
                   and port_names <= {p["name"] for p in svc["spec"]["ports"]}]
        assert scraped, f"ServiceMonitor {name} selects no Service with ports {port_names}"
        for svc in scraped:
            workload = pods_behind(svc)
            env = resolved_env(workload)
            metrics = int(env[SPECS[name].env_prefix() + "METRICS_PORT"])
            port = next(p for p in svc["spec"]["ports"] if p["name"] == "metrics")
            target = container_ports(main_container(workload))[port["targetPort"]]
            assert target == metrics, f"{name}: scrapes {target}, /metrics is on {metrics}"


def test_structural_check_catches_a_broken_monitor() -> None:
    broken = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
              "metadata": {"name": "x"}, "spec": {"endpoints": [{"port": 9100}]}}
    problems = check_service_monitor(broken)
    assert "spec.selector.matchLabels missing" in problems
    assert "endpoint.port must name a Service port" in problems


# --- settings, ports, Services --------------------------------------------------------------


def pods_behind(service: Mapping[str, Any]) -> dict[str, Any]:
    """The one workload whose pods a Service selects."""
    selector = service["spec"]["selector"]
    matched = [w for w in workloads().values() if selector.items() <= pod_labels(w).items()]
    assert len(matched) == 1, f"Service {service['metadata']['name']} selects {len(matched)}"
    return matched[0]


WORKLOADS = sorted(workloads())


def test_every_service_has_its_workload() -> None:
    by_service = {service_of(w): w for w in workloads().values()}
    assert set(SPECS) <= set(by_service), f"missing: {set(SPECS) - set(by_service)}"
    assert by_service["worker"]["kind"] == "StatefulSet"
    assert by_service["migrate"]["kind"] == "Job"
    for name in ("gateway", "registry", "admission", "cache-manager"):
        assert by_service[name]["kind"] == "Deployment", name


@pytest.mark.parametrize("name", WORKLOADS)
def test_env_vars_are_settings_fields(name: str) -> None:
    workload = workloads()[name]
    env = env_of(main_container(workload))
    unknown = sorted(k for k in env if k.startswith("LORAPLANE_") and k not in known_env(workload))
    assert not unknown, f"{name}: sets variables its settings do not read: {unknown}"


@pytest.mark.parametrize("name", [w for w in WORKLOADS if w in SPECS])
def test_env_values_load_into_the_settings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("LORAPLANE_"):
            monkeypatch.delenv(key)
    for key, value in resolved_env(workloads()[name]).items():
        monkeypatch.setenv(key, value)
    for cls in settings_classes(name):
        settings = cls(_env_file=None)  # type: ignore[call-arg]
        assert settings is not None


@pytest.mark.parametrize("name", [w for w in WORKLOADS if w in SPECS])
def test_ports_match_the_settings(name: str) -> None:
    workload = workloads()[name]
    spec = SPECS[name]
    container = main_container(workload)
    env = env_of(container)
    ports = container_ports(container)
    expected = {spec.env_prefix() + k: k.removesuffix("_PORT").lower()
                for k in (*spec.port_offsets, "METRICS_PORT")}
    for var, port_name in expected.items():
        assert var in env, f"{name}: {var} not set (the default is the make-run port)"
        assert ports.get(port_name) == int(literal(env, var)), (
            f"{name}: {var}={literal(env, var)} but containerPort {port_name}={ports.get(port_name)}")
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if probe is None:
            continue
        target = probe.get("grpc", {}).get("port") or probe.get("httpGet", {}).get("port")
        assert target in ports or target in ports.values(), f"{name}: {kind} on {target}"
    assert container.get("readinessProbe") and container.get("livenessProbe"), name


def test_services_target_named_container_ports() -> None:
    for name, svc in objects("Service").items():
        ports = container_ports(main_container(pods_behind(svc)))
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {name}: no container port {port}"
            assert port["name"] == port["targetPort"], f"Service {name}: {port}"
            if svc["spec"].get("type") != "LoadBalancer":
                assert port["port"] == ports[port["targetPort"]], f"Service {name}: {port}"


def addresses(workload: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """``*_ADDR`` variables of a container: name -> (host, port)."""
    out = {}
    for name, value in resolved_env(workload).items():
        if name.endswith("_ADDR"):
            host, _, port = value.rpartition(":")
            out[name] = (host, int(port))
    return out


def test_addresses_name_services_and_their_ports() -> None:
    services = objects("Service")
    seen = 0
    for name, workload in workloads().items():
        for var, (host, port) in addresses(workload).items():
            assert host in services, f"{name}: {var} names {host}, no such Service"
            assert port in {p["port"] for p in services[host]["spec"]["ports"]}, (name, var)
            seen += 1
    assert seen >= 2, "the gateway dials the registry and the cache-manager"


# --- the shapes the platform needs ------------------------------------------------------------


def test_gateway_scales_with_an_hpa() -> None:
    hpa = objects("HorizontalPodAutoscaler")["gateway"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "gateway")
    assert target["name"] in objects("Deployment")
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    # A Utilization target is relative to the CPU request: without one the HPA does nothing.
    assert main_container(objects("Deployment")["gateway"])["resources"]["requests"]["cpu"]


def pdbs_selecting(workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [p for p in objects("PodDisruptionBudget").values()
            if p["spec"]["selector"]["matchLabels"].items() <= pod_labels(workload).items()]


def test_workers_are_a_statefulset_with_gpus_and_a_pdb() -> None:
    worker = objects("StatefulSet")["worker"]
    resources = main_container(worker)["resources"]
    assert int(resources["limits"]["nvidia.com/gpu"]) >= 1
    assert resources["requests"].get("nvidia.com/gpu") == resources["limits"]["nvidia.com/gpu"]
    headless = objects("Service")[worker["spec"]["serviceName"]]
    assert headless["spec"].get("clusterIP") == "None"
    pdbs = pdbs_selecting(worker)
    assert len(pdbs) == 1 and pdbs[0]["spec"].get("maxUnavailable") == 1
    env = env_of(main_container(worker))
    # The worker id is the Kafka key of its commands and state: stable per pod (worker-N).
    assert env["LORAPLANE_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    mounts = {m["mountPath"] for m in main_container(worker)["volumeMounts"]}
    host_dir = Path(literal(env, "LORAPLANE_WORKER_HOST_DIR"))
    assert any(host_dir.is_relative_to(m) for m in mounts), "the WARM tier is not on a volume"
    assert {t["metadata"]["name"] for t in worker["spec"]["volumeClaimTemplates"]} & {
        m["name"] for m in main_container(worker)["volumeMounts"]}


def test_worker_serves_a_catalogued_model_within_its_rank() -> None:
    catalogue = yaml.safe_load((ROOT / "config/base_models.yaml").read_text())["base_models"]
    env = env_of(main_container(objects("StatefulSet")["worker"]))
    model = literal(env, "LORAPLANE_BASE_MODEL")
    assert model in catalogue, f"{model} is not in config/base_models.yaml (admission rejects all)"
    entry = catalogue[model]
    # A rank above the engine's max_lora_rank kills the engine: admission must refuse first.
    assert int(literal(env, "LORAPLANE_WORKER_MAX_LORA_RANK")) >= entry["max_lora_rank"]
    assert literal(env, "LORAPLANE_TOKENIZER_REVISION") == entry["tokenizer_revision"]
    for var in ("LORAPLANE_BASE_MODEL_DIR", "LORAPLANE_TRUSTED_KEYS"):
        assert var in env, f"{var} unset: the worker would refuse to start"


def test_cache_manager_runs_a_leader_and_a_standby() -> None:
    cm = objects("Deployment")["cache-manager"]
    assert cm["spec"]["replicas"] == 2
    assert [p["spec"].get("maxUnavailable") for p in pdbs_selecting(cm)] == [1]


def test_migrations_run_as_a_job_with_dbmate() -> None:
    job = objects("Job")["migrate"]
    container = main_container(job)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert container["command"][0] in scripts, "the Job runs the loraplane console script"
    assert container["command"][1:] == ["db", "migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")


@pytest.mark.parametrize("name", WORKLOADS)
def test_pods_run_unprivileged(name: str) -> None:
    workload = workloads()[name]
    pod = pod_spec(workload)
    assert pod.get("automountServiceAccountToken") is False, f"{name}: mounts an API token"
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == IMAGE_UID, name
    assert security["seccompProfile"]["type"] == "RuntimeDefault", name
    container = main_container(workload)
    csc = container["securityContext"]
    assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"]
    assert csc["readOnlyRootFilesystem"] is True, name
    assert ":" not in container["image"] or not container["image"].endswith(":latest")
    assert container["resources"]["requests"], name


# --- Secrets ---------------------------------------------------------------------------------


def secret_refs() -> Iterator[tuple[str, str, str | None]]:
    """(workload, secret, key or None for a whole-Secret volume) for every reference."""
    for name, workload in workloads().items():
        for entry in env_of(main_container(workload)).values():
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                yield name, ref["name"], ref["key"]
        for volume in pod_spec(workload).get("volumes", []):
            if "secret" in volume:
                yield name, volume["secret"]["secretName"], None


def test_secrets_are_referenced_never_valued() -> None:
    assert not objects("Secret"), "a Secret in the kustomization (values belong outside git)"
    referenced: set[tuple[str, str]] = set()
    for workload, secret, key in secret_refs():
        assert secret in SECRET_TEMPLATES, f"{workload}: Secret {secret} has no template"
        if key is not None:
            assert key in SECRET_TEMPLATES[secret].get("stringData", {}), (workload, secret, key)
            referenced.add((secret, key))
    for name, template in SECRET_TEMPLATES.items():
        assert not template.get("data"), f"{name}: data in a template"
        for key, value in template.get("stringData", {}).items():
            assert value == "", f"template {name}/{key} carries a value"
            assert (name, key) in referenced or name.endswith("keys"), f"{name}/{key} unused"
    for name, workload in workloads().items():
        for var, entry in env_of(main_container(workload)).items():
            if SENSITIVE.search(var):
                assert "secretKeyRef" in entry.get("valueFrom", {}), f"{name}: {var} not a Secret"


# --- NetworkPolicies -------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    """A traffic endpoint: a pod (namespace, its labels, pod labels) or outside the cluster."""

    name: str
    namespace: str | None
    ns_labels: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()


def peer(name: str, namespace: str | None, labels: Mapping[str, str] | None = None,
         ns_labels: Mapping[str, str] | None = None) -> Peer:
    ns = dict(ns_labels or {})
    if namespace is not None:
        ns["kubernetes.io/metadata.name"] = namespace
    return Peer(name, namespace, tuple(sorted(ns.items())), tuple(sorted((labels or {}).items())))


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"evaluator reads matchLabels only: {selector}"
    return dict(selector.get("matchLabels", {})).items() <= dict(labels).items()


def _peer_matches(rule_peer: Mapping[str, Any], target: Peer, policy_ns: str) -> bool:
    if "ipBlock" in rule_peer:
        # Outside addresses: only a block covering everything is taken to include them.
        net = ipaddress.ip_network(rule_peer["ipBlock"]["cidr"])
        return target.namespace is None and net.prefixlen == 0
    if target.namespace is None:
        return False
    ns_sel = rule_peer.get("namespaceSelector")
    ns_ok = (target.namespace == policy_ns if ns_sel is None
             else _selects(ns_sel, dict(target.ns_labels)))
    pod_sel = rule_peer.get("podSelector")
    return ns_ok and (pod_sel is None or _selects(pod_sel, dict(target.labels)))


def _port_matches(rule: Mapping[str, Any], port: int, protocol: str) -> bool:
    if "ports" not in rule:
        return True
    for p in rule["ports"]:
        assert isinstance(p.get("port", 0), int), "evaluator reads numeric ports only"
        if p.get("protocol", "TCP") == protocol and p.get("port") in (None, port):
            return True
    return False


def _direction_allows(policies: list[dict[str, Any]], subject: Peer, other: Peer, port: int,
                      protocol: str, direction: str) -> bool:
    if subject.namespace != NAMESPACE:
        return True  # only this namespace's policies are modelled
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [p for p in policies if direction in p["spec"]["policyTypes"]
                 and _selects(p["spec"]["podSelector"], dict(subject.labels))]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(key, []):
            peers = rule.get(peers_key)
            if (peers is None or any(_peer_matches(rp, other, NAMESPACE) for rp in peers)) \
                    and _port_matches(rule, port, protocol):
                return True
    return False


def allowed(src: Peer, dst: Peer, port: int, protocol: str = "TCP") -> bool:
    policies = list(objects("NetworkPolicy").values())
    return (_direction_allows(policies, src, dst, port, protocol, "Egress")
            and _direction_allows(policies, dst, src, port, protocol, "Ingress"))


def pod(name: str) -> Peer:
    return peer(name, NAMESPACE, pod_labels(workloads()[name]),
                objects("Namespace")[NAMESPACE]["metadata"].get("labels"))


def _endpoint_port(key: str) -> int:
    return int(objects("ConfigMap")["loraplane-endpoints"]["data"][key].rpartition(":")[2])


INTERNET = peer("internet", None)
TENANT_POD = peer("tenant-pod", "tenant-a", {"app": "client"})
OPERATOR = peer("ci", "ci", {"app": "release"}, {"loraplane.io/operator-access": "true"})
PROMETHEUS = peer("prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"})
DNS = peer("kube-dns", "kube-system", {"k8s-app": "kube-dns"})
POSTGRES = peer("postgres", "loraplane-data", {"loraplane.io/infra": "postgres"})
KAFKA = peer("kafka", "loraplane-data", {"loraplane.io/infra": "kafka"})
OBJECT_STORE = peer("object-store", "loraplane-data", {"loraplane.io/infra": "object-store"})
POSTGRES_PORT = 5432


def test_there_is_a_default_deny_both_ways() -> None:
    deny = [p for p in objects("NetworkPolicy").values()
            if p["spec"]["podSelector"] == {} and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
            and not p["spec"].get("ingress") and not p["spec"].get("egress")]
    assert deny, "no default-deny policy"


def test_tenants_reach_only_the_gateways_public_ports() -> None:
    public = {("gateway", 50055), ("gateway", 8080)}
    assert {p["port"] for p in objects("NetworkPolicy")["gateway"]["spec"]["ingress"][0]["ports"]} \
        == {port for _, port in public}
    for name, workload in workloads().items():
        for port in container_ports(main_container(workload)).values():
            for outsider in (INTERNET, TENANT_POD):
                expect = (service_of(workload), port) in public
                assert allowed(outsider, pod(name), port) == expect, (outsider.name, name, port)


def test_only_workers_and_admission_reach_the_object_store() -> None:
    s3 = _endpoint_port("s3-endpoint")
    reach = {name for name in workloads() if allowed(pod(name), OBJECT_STORE, s3)}
    assert reach == {"worker", "admission"}
    holders = {w for w, secret, _ in secret_refs() if secret == "loraplane-object-store"}
    assert holders == {"worker", "admission"}, "object-store credentials elsewhere"


@pytest.mark.parametrize("name", WORKLOADS)
def test_each_workload_reaches_the_infrastructure_it_is_configured_for(name: str) -> None:
    env = resolved_env(workloads()[name])
    needs = {
        (POSTGRES, POSTGRES_PORT): "LORAPLANE_POSTGRES_DSN" in env,
        (KAFKA, _endpoint_port("kafka-bootstrap")): "LORAPLANE_KAFKA_BOOTSTRAP" in env,
        (OBJECT_STORE, _endpoint_port("s3-endpoint")): "LORAPLANE_S3_ENDPOINT" in env,
    }
    for (target, port), needed in needs.items():
        assert allowed(pod(name), target, port) == needed, (
            f"{name} -> {target.name}:{port} {'closed' if needed else 'open'}")
    assert allowed(pod(name), DNS, 53, "UDP"), f"{name}: no DNS"


@pytest.mark.parametrize("name", WORKLOADS)
def test_each_workload_reaches_the_services_it_dials_and_nothing_else(name: str) -> None:
    services = objects("Service")
    dialled = {(service_of(pods_behind(services[host])), port)
               for host, port in addresses(workloads()[name]).values()}
    if service_of(workloads()[name]) == "gateway":
        dialled.add(("worker", 50054))  # the addresses workers report on cache.state
    if service_of(workloads()[name]) == "cache-manager":
        dialled.add(("worker", 50054))  # GetState of every known worker at takeover
    for other in workloads():
        for port in container_ports(main_container(workloads()[other])).values():
            if other == name or port == 9100:
                continue
            expect = (service_of(workloads()[other]), port) in dialled
            assert allowed(pod(name), pod(other), port) == expect, (name, other, port)


def test_prometheus_and_operators_get_in_where_they_must() -> None:
    public = {("gateway", 50055), ("gateway", 8080)}
    for name in workloads():
        for port in container_ports(main_container(workloads()[name])).values():
            expect = port == 9100 or (service_of(workloads()[name]), port) in public
            assert allowed(PROMETHEUS, pod(name), port) == expect, (name, port)
    assert allowed(OPERATOR, pod("registry"), 50051)
    assert allowed(OPERATOR, pod("cache-manager"), 50053)
    assert not allowed(OPERATOR, pod("worker"), 50054)
    # The placement page: on, for operators only (not the gateway, tenants or Prometheus).
    cm = main_container(workloads()["cache-manager"])
    page = int(literal(env_of(cm), "LORAPLANE_CACHE_MANAGER_PAGE_PORT"))
    assert page and container_ports(cm)["page"] == page
    assert allowed(OPERATOR, pod("cache-manager"), page)
    for outsider in (pod("gateway"), PROMETHEUS, TENANT_POD, INTERNET):
        assert not allowed(outsider, pod("cache-manager"), page), outsider.name


def test_evaluator_denies_what_a_policy_leaves_out() -> None:
    # Sanity of the evaluator itself, on a policy written here.
    policy = {"spec": {"podSelector": {"matchLabels": {"a": "b"}}, "policyTypes": ["Ingress"],
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"c": "d"}}}],
                                    "ports": [{"port": 1}]}]}}
    dst = peer("dst", NAMESPACE, {"a": "b"})
    friend = peer("friend", NAMESPACE, {"c": "d"})
    stranger = peer("stranger", NAMESPACE, {"c": "e"})
    assert _direction_allows([policy], dst, friend, 1, "TCP", "Ingress")
    assert not _direction_allows([policy], dst, friend, 2, "TCP", "Ingress")
    assert not _direction_allows([policy], dst, stranger, 1, "TCP", "Ingress")
    assert not _direction_allows([policy], dst, INTERNET, 1, "TCP", "Ingress")
