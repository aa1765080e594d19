"""The checks of deploy/ that need a parser: run by deploy/check in its Python environment.

  k8s DIR              Kubernetes manifests against the Kubernetes JSON schemas (strict), the
                       KEDA ScaledObject and the ServiceMonitor against schemas generated from
                       their CRD models (made strict the same way), and the references between
                       objects (Secrets, ConfigMaps, selectors, ports, grace periods).
  compose FILE SCHEMA  the compose file against the Compose specification's JSON schema, and
                       its references (services, mounted files).
  grafana DIR          the dashboards (JSON) and the provisioning files.
  config OUT           writes the files and environments the binaries get when deployed to OUT
                       (see write_config), for the checks that run the real binaries.
  names METRICS...     every metric name used by the dashboards, the alert rules and the KEDA
                       query is exported: METRICS are /metrics pages of running binaries.
  promql URL           every one of those queries is accepted by the Prometheus server at URL.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# Kubernetes versions the manifests must be valid for: the oldest still common, and the
# newest the validator knows.
K8S_VERSIONS = ["1.29", None]

failures: list[str] = []


def fail(message: str) -> None:
    failures.append(message)
    print(f"  FAIL {message}", file=sys.stderr)


def load_documents(path: Path) -> list[dict]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def strict(schema):
    """additionalProperties: false on every object schema that lists its properties, as in
    kubernetes-validate's -strict schemas: unknown (invented or misspelt) fields are errors."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema


def crd_schemas() -> dict[tuple[str, str], dict]:
    """JSON schemas of the custom resources used, from the pydantic models that the
    cloudcoil-models-* packages generate from the projects' own CRDs."""
    from cloudcoil.models.keda.v1alpha1 import ScaledObject
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    return {
        ("keda.sh/v1alpha1", "ScaledObject"): strict(ScaledObject.model_json_schema(by_alias=True)),
        ("monitoring.coreos.com/v1", "ServiceMonitor"): strict(
            ServiceMonitor.model_json_schema(by_alias=True)
        ),
    }


def duration_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text.strip())
    if not match:
        raise ValueError(f"not a duration: {text!r}")
    return float(match.group(1)) * units[match.group(2)]


def env_value(container: dict, name: str) -> str | None:
    for item in container.get("env", []):
        if item["name"] == name:
            return item.get("value")
    return None


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def check_k8s(directory: Path) -> None:
    import jsonschema
    import kubernetes_validate.utils as kv

    crds = crd_schemas()
    objects: list[tuple[Path, dict]] = []
    files = sorted(directory.glob("*.yaml"))
    if not files:
        fail(f"no manifests in {directory}")
    for path in files:
        for doc in load_documents(path):
            objects.append((path, doc))
            name = f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            key = (doc.get("apiVersion"), doc.get("kind"))
            if not all(key) or not doc.get("metadata", {}).get("name"):
                fail(f"{name}: apiVersion, kind and metadata.name are required")
                continue
            if key in crds:
                errors = list(jsonschema.Draft202012Validator(crds[key]).iter_errors(doc))
                for error in errors:
                    fail(f"{name}: {'/'.join(map(str, error.absolute_path))}: {error.message}")
                if not errors:
                    print(f"  ok   {name} (CRD schema)", file=sys.stderr)
                continue
            before = len(failures)
            for version in K8S_VERSIONS:
                version = version or kv.latest_version()
                try:
                    kv.validate(doc, version, strict=True)
                except kv.ValidationError as error:
                    path_text = "/".join(map(str, error.absolute_path))
                    fail(f"{name}: Kubernetes {version}: {path_text}: {error.message}")
                except kv.SchemaNotFoundError as error:
                    fail(f"{name}: {error.message}")
            if len(failures) == before:
                versions = ", ".join(v or kv.latest_version() for v in K8S_VERSIONS)
                print(f"  ok   {name} (Kubernetes {versions})", file=sys.stderr)
    check_k8s_references([doc for _, doc in objects])


def check_k8s_references(docs: list[dict]) -> None:
    """What a schema cannot see: that the objects fit together."""

    def of_kind(kind):
        return [d for d in docs if d.get("kind") == kind]

    def named(kind, name):
        return next((d for d in of_kind(kind) if d["metadata"]["name"] == name), None)

    secrets = {d["metadata"]["name"]: set(d.get("stringData", {})) | set(d.get("data", {})) for d in of_kind("Secret")}
    configmaps = {d["metadata"]["name"]: set(d.get("data", {})) for d in of_kind("ConfigMap")}
    namespaces = {d["metadata"]["name"] for d in of_kind("Namespace")}
    workloads = of_kind("Deployment") + of_kind("Job")
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] != "Namespace" and namespace not in namespaces:
            fail(f"{doc['kind']}/{doc['metadata']['name']}: namespace {namespace!r} is not defined")
    for workload in workloads:
        what = f"{workload['kind']}/{workload['metadata']['name']}"
        pod = workload["spec"]["template"]
        if workload["kind"] == "Deployment" and not selects(
            workload["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"]
        ):
            fail(f"{what}: selector does not match its pod labels")
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for volume in volumes.values():
            if "configMap" in volume and volume["configMap"]["name"] not in configmaps:
                fail(f"{what}: volume {volume['name']}: no ConfigMap {volume['configMap']['name']}")
        for container in pod["spec"]["containers"]:
            ports = {p.get("name") for p in container.get("ports", [])}
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["key"] not in secrets.get(ref["name"], set()):
                    fail(f"{what}: env {item['name']}: no key {ref['key']} in Secret {ref['name']}")
            for source in container.get("envFrom", []):
                ref = source.get("secretRef")
                if ref and ref["name"] not in secrets:
                    fail(f"{what}: envFrom: no Secret {ref['name']}")
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in volumes:
                    fail(f"{what}: volumeMount {mount['name']} has no volume")
            for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = container.get(probe_name, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in ports:
                    fail(f"{what}: {probe_name} uses port {port!r}, which the container does not name")
            command = container.get("command", [])
            if command[:2] == ["receiver", "serve"]:
                if container.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
                    fail(f"{what}: the receiver's readiness probe must be GET /readyz")
                if container.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
                    fail(f"{what}: the receiver's liveness probe must be GET /healthz")
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
                needed = duration_seconds(env_value(container, "RECEIVER_SHUTDOWN_TIMEOUT") or "30s")
                if grace <= needed:
                    fail(f"{what}: terminationGracePeriodSeconds {grace} leaves no margin over RECEIVER_SHUTDOWN_TIMEOUT ({needed:g}s)")
            if command[:2] == ["worker", "run"]:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
                shutdown = env_value(container, "WORKER_SHUTDOWN_GRACE")
                if shutdown is None:
                    fail(f"{what}: set WORKER_SHUTDOWN_GRACE explicitly, to match terminationGracePeriodSeconds")
                elif grace < duration_seconds(shutdown) + 5:
                    fail(f"{what}: terminationGracePeriodSeconds {grace} must exceed WORKER_SHUTDOWN_GRACE ({shutdown}) by a margin (5s or more)")
    pods = [(w, w["spec"]["template"]) for w in of_kind("Deployment")]
    for service in of_kind("Service"):
        what = f"Service/{service['metadata']['name']}"
        matched = [w for w, pod in pods if selects(service["spec"]["selector"], pod["metadata"]["labels"])]
        if len(matched) != 1:
            fail(f"{what}: selects {len(matched)} Deployments, expected 1")
            continue
        container_ports = {p.get("name") for c in matched[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            if isinstance(port.get("targetPort"), str) and port["targetPort"] not in container_ports:
                fail(f"{what}: targetPort {port['targetPort']!r} is not a container port name")
    for monitor in of_kind("ServiceMonitor"):
        what = f"ServiceMonitor/{monitor['metadata']['name']}"
        matched = [s for s in of_kind("Service") if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
        if len(matched) != 1:
            fail(f"{what}: selects {len(matched)} Services, expected 1")
            continue
        names = {p.get("name") for p in matched[0]["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            if endpoint.get("port") not in names:
                fail(f"{what}: port {endpoint.get('port')!r} is not a port of Service/{matched[0]['metadata']['name']}")
    for scaler in of_kind("HorizontalPodAutoscaler") + of_kind("ScaledObject"):
        target = scaler["spec"]["scaleTargetRef"]["name"]
        if named("Deployment", target) is None:
            fail(f"{scaler['kind']}/{scaler['metadata']['name']}: no Deployment {target}")
    for budget in of_kind("PodDisruptionBudget"):
        if not any(selects(budget["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"]) for _, pod in pods):
            fail(f"PodDisruptionBudget/{budget['metadata']['name']}: selects no pods")
    for scaler in of_kind("ScaledObject"):
        for trigger in scaler["spec"]["triggers"]:
            if trigger["type"] == "prometheus" and "inbox_backlog_due" not in trigger["metadata"]["query"]:
                fail(f"ScaledObject/{scaler['metadata']['name']}: the prometheus trigger should query inbox_backlog_due")
    if not failures:
        print("  ok   references between the manifests", file=sys.stderr)


def check_compose(path: Path, schema_path: Path) -> None:
    import jsonschema

    schema = json.loads(schema_path.read_text())
    doc = yaml.safe_load(path.read_text())
    # The specification's schema declares draft 2019-09.
    validator = jsonschema.Draft201909Validator(schema)
    for error in validator.iter_errors(doc):
        fail(f"{path.name}: {'/'.join(map(str, error.absolute_path))}: {error.message}")
    services = doc.get("services", {})
    for name, service in services.items():
        if "image" not in service and "build" not in service:
            fail(f"{path.name}: service {name} has neither image nor build")
        depends = service.get("depends_on", {})
        for other in depends if isinstance(depends, (list, dict)) else []:
            if other not in services:
                fail(f"{path.name}: service {name} depends on unknown service {other}")
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith("."):
                if not (path.parent / source).exists():
                    fail(f"{path.name}: service {name} mounts {source}, which does not exist")
            elif source and source not in (doc.get("volumes") or {}):
                fail(f"{path.name}: service {name} mounts undeclared volume {source}")
        build = service.get("build")
        if isinstance(build, dict):
            dockerfile = path.parent / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
            if not dockerfile.exists():
                fail(f"{path.name}: service {name} builds from {dockerfile}, which does not exist")
    if not failures:
        print(f"  ok   {path.name}: {len(services)} services (Compose specification schema)", file=sys.stderr)


def dashboards(directory: Path) -> list[tuple[Path, dict]]:
    return [(p, json.loads(p.read_text())) for p in sorted(directory.glob("dashboards/*.json"))]


def panel_targets(panels: list[dict]):
    for panel in panels:
        yield from ((panel, t) for t in panel.get("targets", []))
        yield from panel_targets(panel.get("panels", []))


def check_grafana(directory: Path) -> None:
    found = dashboards(directory)
    if not found:
        fail(f"no dashboards in {directory}/dashboards")
    for path, dash in found:
        for field in ("uid", "title", "panels", "schemaVersion"):
            if field not in dash:
                fail(f"{path.name}: no {field}")
        ids = [p["id"] for p in dash["panels"]]
        if len(ids) != len(set(ids)):
            fail(f"{path.name}: panel ids are not unique")
        count = 0
        for panel, target in panel_targets(dash["panels"]):
            count += 1
            if not target.get("expr"):
                fail(f"{path.name}: panel {panel['title']!r}: a target without expr")
        print(f"  ok   {path.name}: {len(dash['panels'])} panels, {count} queries", file=sys.stderr)
    for provisioning in sorted(directory.glob("provisioning/*/*.yaml")):
        doc = yaml.safe_load(provisioning.read_text())
        if doc.get("apiVersion") != 1:
            fail(f"{provisioning.name}: apiVersion must be 1")
        print(f"  ok   {provisioning.relative_to(directory)}", file=sys.stderr)


def write_config(out: Path) -> None:
    """The files the binaries read, as deployed, for the checks that run the real binaries:
    the k8s ConfigMaps' providers.toml and routes.toml, the provider Secret's placeholders
    (providers.env), and the literal environment of every receiver and worker container or
    service (k8s-receiver.env, compose-worker.env, ...), one KEY=VALUE a line."""
    out.mkdir(parents=True, exist_ok=True)
    docs = [d for p in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in load_documents(p)]
    for configmap in (d for d in docs if d["kind"] == "ConfigMap"):
        for name, text in configmap.get("data", {}).items():
            (out / name).write_text(text)
    secrets = {}
    for secret in (d for d in docs if d["kind"] == "Secret"):
        secrets.update(secret.get("stringData", {}))
    secrets.pop("DATABASE_URL", None)
    environments: dict[str, dict[str, str]] = {}

    def add(name: str, env: dict[str, str]) -> None:
        environments.setdefault(name, {}).update(env)

    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            binary = "-".join(container.get("command", [])[:2])
            add(f"k8s-{binary}", {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e})
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for service in compose["services"].values():
        binary = "-".join(service.get("command", [])[:2])
        if binary.split("-")[0] in ("receiver", "worker"):
            env = service.get("environment", {})
            add(f"compose-{binary}", {k: str(v) for k, v in env.items()})
    environments["providers"] = secrets
    for name, env in environments.items():
        for key, value in env.items():
            if not re.fullmatch(r"[A-Za-z0-9_.:/@=+-]+", value):
                fail(f"{name}: the value of {key} has characters the checks cannot pass on")
        (out / f"{name}.env").write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())))
    print(f"  ok   wrote {', '.join(sorted(p.name for p in out.iterdir()))}", file=sys.stderr)


# PromQL words that are not metric names.
PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (good enough for the queries written here)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def queries() -> list[tuple[str, str]]:
    """Every PromQL query the deployment uses: dashboards, alert rules, the KEDA trigger."""
    found = []
    for path, dash in dashboards(DEPLOY / "grafana"):
        for panel, target in panel_targets(dash["panels"]):
            found.append((f"{path.name}: {panel['title']}", target["expr"]))
    for path in sorted((DEPLOY / "prometheus").glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        for group in doc.get("groups", []) if isinstance(doc, dict) else []:
            for rule in group["rules"]:
                found.append((f"{path.name}: {rule.get('alert') or rule.get('record')}", rule["expr"]))
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in load_documents(path):
            for trigger in doc.get("spec", {}).get("triggers", []) if doc.get("kind") == "ScaledObject" else []:
                if trigger["type"] == "prometheus":
                    found.append((f"{path.name}: {doc['metadata']['name']}", trigger["metadata"]["query"]))
    return found


def exported_names(pages: list[Path]) -> set[str]:
    names = set()
    for page in pages:
        for line in page.read_text().splitlines():
            if line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def check_names(pages: list[Path]) -> None:
    exported = exported_names(pages)
    used: dict[str, set[str]] = {}
    for source, expr in queries():
        for name in metric_names(expr):
            used.setdefault(name, set()).add(source.split(":")[0])
    for name in sorted(used):
        if name not in exported:
            fail(f"{name} (used in {', '.join(sorted(used[name]))}) is not exported by the running receiver or worker")
    ok = len([n for n in used if n in exported])
    mark = "ok  " if ok == len(used) else "    "
    print(f"  {mark} {ok} of {len(used)} metric names used are exported ({len(exported)} series names exported)", file=sys.stderr)


def check_promql(url: str) -> None:
    checked = 0
    for source, expr in queries():
        query = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
        request = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as error:
            answer = json.load(error)
        if answer.get("status") != "success":
            fail(f"{source}: Prometheus rejects the query: {answer.get('error')}: {query}")
        checked += 1
    if not failures:
        print(f"  ok   Prometheus accepted {checked} queries (dashboards, rules, KEDA)", file=sys.stderr)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    if command == "k8s":
        check_k8s(Path(args[0]))
    elif command == "compose":
        check_compose(Path(args[0]), Path(args[1]))
    elif command == "grafana":
        check_grafana(Path(args[0]))
    elif command == "config":
        write_config(Path(args[0]))
    elif command == "names":
        check_names([Path(a) for a in args])
    elif command == "promql":
        check_promql(args[0])
    else:
        print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
