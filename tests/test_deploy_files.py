"""The deployment files, checked here as far as a machine without a container engine or a cluster
can: the Dockerfile by hadolint and by what the image must be (multi-stage, the install script,
non-root, a health check on /livez, one entrypoint); compose.yaml against the Compose
specification's schema and by how its services start; deploy/kubernetes/ rendered by
``kubectl kustomize`` and validated against Kubernetes' schemas, then by what every workload must
carry (non-root, read-only root, resources, probes, the Secret and ConfigMap it names).

What the image runs is tested by tests/test_install.py: the same install script, then the
entrypoint's commands. Each linter is also shown a broken file, so a check that stopped running
would fail here instead of passing in silence."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.promtool import promtool

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
ENTRYPOINT_COMMANDS = {"web", "worker", "migrate"}
KUSTOMIZE_TREES = ["deploy/kubernetes/base", "deploy/kubernetes/overlays/example"]
# The Kubernetes versions the manifests must be valid for: the oldest still in common support, and
# the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ["1.29.0", "1.37.0"]


def _tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{path} is missing: make install"
    return str(path)


def _run(args: list[str], *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120)


# --- Dockerfile -------------------------------------------------------------------------------------


def _stages(dockerfile: str) -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions per stage, as (INSTRUCTION, arguments); continuations joined."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    stages: list[list[tuple[str, str]]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), arguments.strip()))
    return stages


def test_hadolint_passes_the_dockerfile_and_refuses_a_bad_one(tmp_path: Path) -> None:
    done = _run([_tool("hadolint"), "Dockerfile"])
    assert done.returncode == 0, done.stdout + done.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /src && pip install .\n")
    refused = _run([_tool("hadolint"), str(bad)])
    assert refused.returncode != 0
    assert "DL3007" in refused.stdout  # "latest" as the tag


def test_the_image_is_multi_stage_non_root_and_checks_its_own_health() -> None:
    stages = _stages((ROOT / "Dockerfile").read_text())
    assert len(stages) >= 2, "multi-stage: a build stage and a final one"
    build, final = stages[0], stages[-1]
    # The Python steps are the install script the install test runs too.
    assert ("RUN", "sh deploy/docker/install.sh /src /opt/saga") in build
    runs = " ".join(arguments for instruction, arguments in final if instruction == "RUN")
    for tool in ("gcc", "build-essential", "apt-get install", "pip install"):
        assert tool not in runs, f"the final stage installs {tool!r}"
    copies = [arguments for instruction, arguments in final if instruction == "COPY"]
    assert copies == ["--from=build /opt/saga /opt/saga"], "the final stage copies the install only"
    user = [arguments for instruction, arguments in final if instruction == "USER"]
    assert user and user[-1] not in {"root", "0", "0:0"}, user
    assert any(i == "ARG" and a == "SAGA_UID=10001" for i, a in final)
    # One check for every container of the image, of what that container runs (the probe reads
    # SAGA_PROCESS, which the entrypoint exports): not the web's /livez for the worker's container.
    healthcheck = " ".join(a for i, a in final if i == "HEALTHCHECK")
    assert healthcheck.endswith('CMD ["python", "-m", "saga_admin.probe"]'), healthcheck
    entrypoint = (ROOT / "deploy" / "docker" / "entrypoint.sh").read_text()
    assert "export SAGA_PROCESS" in entrypoint and "SAGA_PROCESS=$command" in entrypoint
    assert ("ENTRYPOINT", '["/opt/saga/entrypoint.sh"]') in final
    assert ("CMD", '["web"]') in final
    env = " ".join(a for i, a in final if i == "ENV")
    assert "STATIC_ROOT=/opt/saga/static" in env and "DJANGO_SETTINGS_MODULE=saga_admin.settings" in env


def test_the_build_context_keeps_what_the_install_needs() -> None:
    """.dockerignore leaves out the checkout's bulk, not what deploy/docker/install.sh reads."""
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    needed = {
        "pyproject.toml",
        "README.md",
        "Procfile",
        "deploy",
        "saga_admin",
        "ledger",
        "recovery",
        "dashboard",
        "demo",
    }
    assert not needed & ignored
    assert {".git", ".venv", "tests", ".env"} <= ignored


# --- compose.yaml -------------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_compose_file_is_valid_against_the_compose_specification(tmp_path: Path) -> None:
    checker = [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec"]
    done = _run([*checker, "compose.yaml"])
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "compose.yaml"
    broken.write_text(
        (ROOT / "compose.yaml")
        .read_text()
        .replace("condition: service_completed_successfully", "condition: when_ready", 1)
    )
    refused = _run([*checker, str(broken)])
    assert refused.returncode != 0 and "when_ready" in refused.stdout + refused.stderr


def test_compose_migrates_once_then_starts_web_and_worker_on_healthy_services() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker"}
    for name in ("postgres", "redis"):
        assert services[name]["healthcheck"]["test"], name
        assert any(":/" in volume for volume in services[name]["volumes"]), (
            f"{name} keeps its data in a volume"
        )
    assert services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "worker"):
        service = services[name]
        assert service["command"] == [name]
        assert service["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"},
            "postgres": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
        }
        assert service["healthcheck"]["test"] == ["CMD", "python", "-m", "saga_admin.probe", name]
    # One image for all three, built from this repository's Dockerfile.
    images = {(services[n]["build"], services[n]["image"]) for n in ("migrate", "web", "worker")}
    assert images == {(".", "${SAGA_IMAGE:-saga-admin:latest}")}
    for name in ("migrate", "web", "worker"):
        env = services[name]["environment"]
        assert env["REDIS_URL"] == "redis://redis:6379/0"


def test_compose_runs_web_and_worker_as_the_role_that_owns_nothing() -> None:
    """Only migrate logs in as the postgres image's POSTGRES_USER (the owner, a superuser); web and
    worker log in as saga_app, which migrate creates and grants (the entrypoint's db_grants)."""
    services = _compose()["services"]
    owner = services["postgres"]["environment"]["POSTGRES_USER"]
    app_url = (
        "postgres://saga_app:${SAGA_APP_DB_PASSWORD:?set SAGA_APP_DB_PASSWORD in .env}@postgres:5432/saga"
    )
    migrate = services["migrate"]["environment"]
    assert migrate["DATABASE_URL"].startswith(f"postgres://{owner}:${{POSTGRES_PASSWORD:?")
    assert migrate["SAGA_APP_DATABASE_URL"] == app_url
    for name in ("web", "worker"):
        env = services[name]["environment"]
        assert env["DATABASE_URL"] == app_url, name
        assert "SAGA_APP_DATABASE_URL" not in env and "POSTGRES_PASSWORD" not in str(env), name


def _documented_variables() -> set[str]:
    return set(re.findall(r"\b([A-Z][A-Z0-9_]{2,})\b", (ROOT / "docs" / "API.md").read_text()))


def test_env_example_names_only_variables_the_server_reads() -> None:
    """A typo in .env.example would be silently ignored by the server: every variable it sets or
    shows commented out is one docs/API.md documents (or compose.yaml itself reads)."""
    text = (ROOT / ".env.example").read_text()
    named = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", text, flags=re.MULTILINE))
    compose_text = (ROOT / "compose.yaml").read_text()
    compose_reads = set(re.findall(r"\$\{([A-Z][A-Z0-9_]+)", compose_text))
    assert {"SECRET_KEY", "POSTGRES_PASSWORD", "ALLOWED_HOSTS"} <= named
    assert compose_reads - {"SAGA_IMAGE", "SAGA_HTTP_PORT"} <= named, (
        "compose needs what .env.example leaves out"
    )
    unknown = named - _documented_variables() - compose_reads
    assert not unknown, f".env.example sets variables nothing reads: {sorted(unknown)}"


# --- Kubernetes -----------------------------------------------------------------------------------------


def _render(tree: str) -> str:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (which renders Kustomize offline) is not on PATH"
    done = _run([kubectl, "kustomize", tree])
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("tree", KUSTOMIZE_TREES)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kustomize_renders_manifests_kubernetes_accepts(tree: str, version: str) -> None:
    done = _run(
        [_tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, "-"], stdin=_render(tree)
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_kubernetes_validate_refuses_a_broken_manifest() -> None:
    broken = _render(KUSTOMIZE_TREES[0]).replace("containerPort: 8000", "containerPort: web", 1)
    done = _run([_tool("kubernetes-validate"), "--strict", "--quiet", "-"], stdin=broken)
    assert done.returncode != 0 and "containerPort" in done.stdout + done.stderr


def _documents(tree: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(_render(tree)) if d}


def _workloads(docs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod specs of the Deployments and the Job, by name."""
    return {
        name: d["spec"]["template"]["spec"]
        for (kind, name), d in docs.items()
        if kind in {"Deployment", "Job"}
    }


@pytest.mark.parametrize("tree", KUSTOMIZE_TREES)
def test_every_workload_runs_hardened_with_resources_and_the_named_config(tree: str) -> None:
    docs = _documents(tree)
    workloads = _workloads(docs)
    assert set(workloads) == {"saga-admin-web", "saga-admin-worker", "saga-admin-migrate"}
    config_maps = {name for kind, name in docs if kind == "ConfigMap"}
    for name, pod in workloads.items():
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == 10001, name  # the image's user
        assert pod["serviceAccountName"] == "saga-admin" and ("ServiceAccount", "saga-admin") in docs
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            where = f"{name}/{container['name']}"
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert container["resources"]["requests"]["memory"], where
            assert container["resources"]["limits"]["memory"], where
            assert {"mountPath": "/tmp", "name": "tmp"} in container["volumeMounts"], where
            refs = container["envFrom"]
            # The generated ConfigMap's hashed name, as kustomize rewrote the reference.
            assert refs[0]["configMapRef"]["name"] in config_maps, where
            assert refs[1] == {"secretRef": {"name": "saga-admin"}}, where
        main = pod["containers"][0]
        assert main["args"][0] in ENTRYPOINT_COMMANDS, name
    assert workloads["saga-admin-migrate"]["containers"][0]["args"] == ["migrate"]
    assert workloads["saga-admin-worker"]["containers"][0]["args"] == ["worker"]
    assert workloads["saga-admin-web"]["containers"][0]["args"] == ["web"]


@pytest.mark.parametrize("tree", KUSTOMIZE_TREES)
def test_probes_service_autoscaler_and_disruption_budgets_point_at_the_right_pods(tree: str) -> None:
    docs = _documents(tree)
    web = docs[("Deployment", "saga-admin-web")]
    web_pod = web["spec"]["template"]
    container = web_pod["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["ports"] == [{"containerPort": 8000, "name": "http"}]
    worker = docs[("Deployment", "saga-admin-worker")]
    worker_probe = worker["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    assert worker_probe["exec"]["command"] == ["python", "-m", "saga_admin.probe", "worker"]
    for deployment in (web, worker):
        init = deployment["spec"]["template"]["spec"]["initContainers"][0]
        assert "migrate --check" in init["command"][-1], "new pods wait for the migrate Job"

    def selects(selector: dict[str, str], pod: dict[str, Any]) -> bool:
        return selector.items() <= pod["metadata"]["labels"].items()

    service = docs[("Service", "saga-admin-web")]
    assert selects(service["spec"]["selector"], web_pod)
    assert not selects(service["spec"]["selector"], worker["spec"]["template"])
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    hpa = docs[("HorizontalPodAutoscaler", "saga-admin-web")]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "saga-admin-web",
    }
    assert hpa["spec"]["minReplicas"] >= 2
    for name, deployment in (("saga-admin-web", web), ("saga-admin-worker", worker)):
        pdb = docs[("PodDisruptionBudget", name)]
        assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        assert selects(pdb["spec"]["selector"]["matchLabels"], deployment["spec"]["template"])


@pytest.mark.parametrize("tree", KUSTOMIZE_TREES)
def test_only_the_migrate_job_sees_the_owners_credentials(tree: str) -> None:
    """The Job migrates as the owner (saga-admin-db-owner's DATABASE_URL, which wins over the one
    in saga-admin) and grants the role of the application's URL; the pods never name the owner."""
    workloads = _workloads(_documents(tree))
    job = workloads["saga-admin-migrate"]["containers"][0]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in job["env"]}
    assert env["DATABASE_URL"] == {"name": "saga-admin-db-owner", "key": "DATABASE_URL"}
    assert env["SAGA_APP_DATABASE_URL"] == {"name": "saga-admin", "key": "DATABASE_URL"}
    for name in ("saga-admin-web", "saga-admin-worker"):
        pod = workloads[name]
        assert "saga-admin-db-owner" not in yaml.safe_dump(pod), name
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            names = {e["name"] for e in container.get("env", [])}
            assert not names & {"DATABASE_URL", "SAGA_APP_DATABASE_URL"}, name


def test_the_example_overlay_pins_the_image_and_its_own_namespace() -> None:
    docs = _documents(KUSTOMIZE_TREES[1])
    for name, pod in _workloads(docs).items():
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            assert container["image"] == "registry.example.com/saga-admin:0.2.0", name
    namespaced = [d for (kind, _), d in docs.items() if kind != "Namespace"]
    assert {d["metadata"].get("namespace") for d in namespaced} == {"saga"}
    ingress = docs[("Ingress", "saga-admin")]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "saga-admin-web", "port": {"name": "http"}}
    config = next(d for (kind, _), d in docs.items() if kind == "ConfigMap")
    assert config["data"]["ALLOWED_HOSTS"] == "saga.example.com"
    assert config["data"]["SAGA_BOOTSTRAP_TENANT"] == "acme"
    assert config["data"]["DEBUG"] == "0"  # merged with the base's, not replacing it
    assert docs[("Deployment", "saga-admin-worker")]["spec"]["replicas"] == 3


# --- Proxies: who is believed (docs/DEPLOY.md, "Proxies") -----------------------------------------


def _procfile_web() -> str:
    line = next(x for x in (ROOT / "Procfile").read_text().splitlines() if x.startswith("web:"))
    return line


def test_the_web_believes_x_forwarded_proto_from_the_configured_proxies_only() -> None:
    """gunicorn sets the scheme from X-Forwarded-Proto for SAGA_TRUSTED_PROXY_IPS only (loopback
    unless configured), and Django does not read the header itself; tests/security/
    test_behind_a_proxy.py proves it over the wire."""
    web = _procfile_web()
    assert "'*'" not in web and '"*"' not in web
    assert '--forwarded-allow-ips "${SAGA_TRUSTED_PROXY_IPS:-127.0.0.1,::1}"' in web
    settings_text = (ROOT / "saga_admin" / "settings.py").read_text()
    assert not re.search(r"^SECURE_PROXY_SSL_HEADER\s*=", settings_text, flags=re.MULTILINE)


def test_compose_publishes_the_web_on_loopback_and_ships_its_proxy_settings() -> None:
    compose = _compose()
    services = compose["services"]
    assert services["web"]["ports"] == ["${SAGA_BIND:-127.0.0.1}:${SAGA_HTTP_PORT:-8000}:8000"]
    for name in ("postgres", "redis", "migrate", "worker"):
        assert "ports" not in services[name], f"{name} is published"
    for name in ("migrate", "web", "worker"):
        env = services[name]["environment"]
        assert env["SAGA_TRUSTED_PROXY_HOPS"] == "${SAGA_TRUSTED_PROXY_HOPS:-1}", name
        trusted = env["SAGA_TRUSTED_PROXY_IPS"]
        assert trusted.startswith("${SAGA_TRUSTED_PROXY_IPS:-") and "*" not in trusted, name
    # The worker's warm shutdown outlasts the longest compensator call (SAGA_STEP_MAX_S, 900 s).
    grace = services["worker"]["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) >= 900, grace


# --- Kubernetes as an SRE expects it ----------------------------------------------------------------


def _config(docs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, str]:
    return next(d for (kind, _), d in docs.items() if kind == "ConfigMap")["data"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions with In) against a pod's labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _pod_labels(docs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {
        name: d["spec"]["template"]["metadata"]["labels"]
        for (kind, name), d in docs.items()
        if kind in {"Deployment", "Job"}
    }


def _namespace_peer(peer: dict[str, Any]) -> str:
    return peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]


@pytest.mark.parametrize("tree", KUSTOMIZE_TREES)
def test_network_policies_admit_only_the_ingress_controller_to_the_web(tree: str) -> None:
    docs = _documents(tree)
    policies = {name: d["spec"] for (kind, name), d in docs.items() if kind == "NetworkPolicy"}
    pods = _pod_labels(docs)
    web, worker, migrate = pods["saga-admin-web"], pods["saga-admin-worker"], pods["saga-admin-migrate"]
    # Everything of ours is denied both ways unless a policy allows it.
    deny = policies["saga-admin-default-deny"]
    assert set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    assert all(_selects(deny["podSelector"], labels) for labels in pods.values())

    def ingress_for(labels: dict[str, str]) -> list[dict[str, Any]]:
        return [
            rule
            for spec in policies.values()
            if "Ingress" in spec["policyTypes"] and _selects(spec["podSelector"], labels)
            for rule in spec.get("ingress", [])
        ]

    # The web: its http port, from the Ingress controller's namespace (and Prometheus's, for
    # /metrics) and from nowhere else; the worker: its metrics port, from Prometheus only;
    # the migrate Job: from nobody.
    web_rules = ingress_for(web)
    assert web_rules and all(r["ports"] == [{"port": "http", "protocol": "TCP"}] for r in web_rules)
    assert {_namespace_peer(p) for r in web_rules for p in r["from"]} == {"ingress-nginx", "monitoring"}
    assert all("podSelector" not in p and "ipBlock" not in p for r in web_rules for p in r["from"])
    worker_rules = ingress_for(worker)
    assert {_namespace_peer(p) for r in worker_rules for p in r["from"]} == {"monitoring"}
    assert all(r["ports"] == [{"port": "metrics", "protocol": "TCP"}] for r in worker_rules)
    assert ingress_for(migrate) == []
    if tree.endswith("example"):
        # The controller the policy names is the one the example's Ingress is for.
        assert docs[("Ingress", "saga-admin")]["spec"]["ingressClassName"] == "nginx"

    def egress_ports(labels: dict[str, str]) -> set[int]:
        return {
            port["port"]
            for spec in policies.values()
            if "Egress" in spec["policyTypes"] and _selects(spec["podSelector"], labels)
            for rule in spec.get("egress", [])
            for port in rule["ports"]
        }

    # DNS for every pod; the database and Redis for the web, the worker and the migrate Job;
    # HTTPS out (compensators, webhooks, sinks, SSO) for the web and the worker, not the Job.
    for labels in (web, worker, migrate):
        assert {53, 5432, 6379, 26379} <= egress_ports(labels), labels
    assert 443 in egress_ports(web) and 443 in egress_ports(worker) and 443 not in egress_ports(migrate)
    dns = policies["saga-admin-egress-dns"]["egress"][0]
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    outbound = policies["saga-admin-egress-outbound"]["egress"][0]["to"][0]["ipBlock"]
    assert "169.254.169.254/32" in outbound["except"], "the cloud metadata address is not a compensator"


@pytest.mark.parametrize("tree", KUSTOMIZE_TREES)
def test_web_and_worker_spread_drain_and_stop_as_they_should(tree: str) -> None:
    docs = _documents(tree)
    config = _config(docs)
    for name in ("saga-admin-web", "saga-admin-worker"):
        pod = docs[("Deployment", name)]["spec"]["template"]
        spread = pod["spec"]["topologySpreadConstraints"]
        assert {c["topologyKey"] for c in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
        for constraint in spread:
            assert _selects(constraint["labelSelector"], pod["metadata"]["labels"]), name
            assert constraint["maxSkew"] == 1 and constraint["whenUnsatisfiable"] == "ScheduleAnyway"
    web = docs[("Deployment", "saga-admin-web")]["spec"]["template"]["spec"]
    pre_stop = web["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and int(pre_stop[1]) >= 5
    # The sleep and gunicorn's 30 s graceful stop both fit in the grace.
    assert web["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + 30
    worker = docs[("Deployment", "saga-admin-worker")]["spec"]["template"]["spec"]
    # From the same manifest: the longest compensator call the worker's ConfigMap allows.
    assert worker["terminationGracePeriodSeconds"] >= int(config["SAGA_STEP_MAX_S"])
    container = worker["containers"][0]
    assert container["readinessProbe"]["exec"]["command"] == [
        "python",
        "-m",
        "saga_admin.probe",
        "worker",
        "--ready",
    ]
    # One proxy hop in front (the Ingress controller), believed from the pod network, not anyone.
    assert config["SAGA_TRUSTED_PROXY_HOPS"] == "1"
    assert config["SAGA_TRUSTED_PROXY_IPS"] and "*" not in config["SAGA_TRUSTED_PROXY_IPS"]


@pytest.mark.parametrize("tree", KUSTOMIZE_TREES)
def test_every_image_is_pinned_to_a_release_not_latest(tree: str) -> None:
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert version
    for name, pod in _workloads(_documents(tree)).items():
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            image = container["image"]
            repository, _, tag = image.rpartition(":")
            assert repository and tag and tag != "latest" and "/" not in tag, (name, image)
            if tree.endswith("base"):
                assert tag == version.group(1), "the base names the release it was written for"


def test_prometheus_scrapes_the_web_and_the_worker_pods_with_the_metrics_token(tmp_path: Path) -> None:
    """deploy/prometheus/scrape-kubernetes.yml keeps exactly the web pods' http port and the
    worker pods' metrics port of the rendered overlay, in its namespace, each with the bearer token
    (SAGA_METRICS_TOKEN, the saga-admin Secret's key, as the docs have you create it). promtool
    checks the file; Debian's promtool is built without Kubernetes discovery, so it is shown the
    jobs with a static target in its place (and a token file that exists)."""
    path = ROOT / "deploy" / "prometheus" / "scrape-kubernetes.yml"
    scrape = yaml.safe_load(path.read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    docs = _documents(KUSTOMIZE_TREES[1])
    namespace = docs[("Deployment", "saga-admin-web")]["metadata"]["namespace"]
    for job_name, deployment, port in (
        ("saga-admin-web", "saga-admin-web", 8000),
        ("saga-admin-worker", "saga-admin-worker", 9100),
    ):
        job = jobs[job_name]
        assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]
        assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": [namespace]}}]
        keep = next(r for r in job["relabel_configs"] if r.get("action") == "keep")
        pod = docs[("Deployment", deployment)]["spec"]["template"]
        labels = pod["metadata"]["labels"]
        [named] = [p for p in pod["spec"]["containers"][0]["ports"] if p["containerPort"] == port]
        wanted = [labels["app.kubernetes.io/name"], labels["app.kubernetes.io/component"], named["name"]]
        assert keep["regex"] == ";".join(wanted), job_name
    token = tmp_path / "token"
    token.write_text("t")
    for job in scrape["scrape_configs"]:
        job.pop("kubernetes_sd_configs")
        job["static_configs"] = [{"targets": ["pod:8000"]}]
        job["authorization"]["credentials_file"] = str(token)
    checked_file = tmp_path / "prometheus.yml"
    checked_file.write_text(yaml.safe_dump(scrape))
    done = promtool("check", "config", str(checked_file))  # make promtool installs Debian's
    assert done.returncode == 0, done.stdout + done.stderr
    # The token the pods read is the Secret's key the docs create, and the base names it.
    deploy_doc = (ROOT / "docs" / "DEPLOY.md").read_text()
    assert "--from-literal=SAGA_METRICS_TOKEN=" in deploy_doc
    assert (
        "SAGA_METRICS_TOKEN" in (ROOT / "deploy" / "kubernetes" / "base" / "kustomization.yaml").read_text()
    )
    for name in ("saga-admin-web", "saga-admin-worker"):
        refs = docs[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        assert {"secretRef": {"name": "saga-admin"}} in refs, name
