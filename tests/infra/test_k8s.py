"""The Kubernetes manifests (infra/k8s), checked offline: no cluster runs on these machines.

Each overlay renders (kubectl's kustomize) and validates against Kubernetes 1.32's schema and the
vendored KEDA / Prometheus Operator CRD schemas (``llmlab_lab.k8s``, ``make k8s-validate``); and
the manifests agree with the code: modules, LLMLAB_* names and values (prod's fail-closed checks
included), ports, probes, pools, GPU counts, the JetStream stream and consumer names and the metric
names the autoscalers read, image tags, drain times. A typo in any of them would otherwise show
only on someone's cluster.
"""

from __future__ import annotations

import copy
import importlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmlab_common.catalog import load_catalog
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_common.subjects import Topology
from llmlab_lab import k8s

from tests.infra.test_infra_files import SERVICES, env_names, infra_env_names, settings_class

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
OUR_IMAGE = "llm-inference-lab"
_MODULE = re.compile(r"^llmlab_\w+$")


@pytest.fixture(scope="module", params=k8s.OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, k8s.render(request.param)


def _of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _env(c: dict[str, Any], docs: list[dict[str, Any]], secret: str = "x") -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom ConfigMaps, then env (a
    secret reference becomes ``secret``)."""
    env: dict[str, str] = {}
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in _of(docs, "ConfigMap")}
    for ref in c.get("envFrom", []):
        env |= maps[ref["configMapRef"]["name"]]
    for e in c.get("env", []):
        env[e["name"]] = e.get("value", secret)
    return env


def _module(c: dict[str, Any]) -> str | None:
    cmd = c.get("command", [])
    return cmd[2] if cmd[:2] == ["python", "-m"] else None


def test_every_overlay_renders_and_validates(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = rendered
    assert k8s.errors(docs) == [], overlay
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Deployment", "ScaledObject", "PodDisruptionBudget", "NetworkPolicy"} <= kinds
    assert {d["metadata"]["name"] for d in _of(docs, "StatefulSet")} == {"nats", "redis", "clickhouse"}
    deployments = {d["metadata"]["name"] for d in _of(docs, "Deployment")}
    assert {"gateway", "router", "budget", "accounting", "worker-vllm", "worker-sglang"} <= deployments
    assert {"prometheus", "grafana", "alertmanager"} <= deployments
    assert all(d["metadata"].get("namespace") == "llmlab" for d in docs if d["kind"] != "Namespace")


def test_the_validation_can_fail() -> None:
    """The validator refuses what the API server would: a misspelt field, a wrong type, an unknown
    field of a custom resource (strict field validation, kubectl's default)."""
    docs = k8s.render("gpu")
    for name, kind, breaks in [
        ("gateway", "Deployment", lambda d: d["spec"].update(replica=2)),
        ("gateway", "Service", lambda d: d["spec"]["ports"][0].update(port="8080")),
        ("worker-vllm", "ScaledObject", lambda d: d["spec"].update(minReplicas=1)),
        ("worker-vllm", "ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold=384)),
        ("llmlab", "PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(prot="x")),
    ]:
        doc = copy.deepcopy(next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name))
        breaks(doc)
        assert k8s.errors([doc]), f"{kind}/{name} broken on purpose passed"


def test_the_config_copies_match_infra() -> None:
    assert k8s.stale_copies() == [], "run make k8s-sync"


def test_our_containers_run_a_module_whose_settings_read_every_llmlab_variable(
    rendered: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every LLMLAB_* variable is a field of the settings class that reads it, and the values
    parse, in prod, past its fail-closed checks (NATS user, admin keys, Redis password)."""
    _, docs = rendered
    seen = set()
    for workload, pod in _pod_specs(docs).items():
        for c in _containers(pod):
            if c["image"].split(":")[0].rsplit("/", 1)[-1] != OUR_IMAGE:
                continue
            module = _module(c)
            assert module and _MODULE.match(module), f"{workload}/{c['name']}: {c.get('command')}"
            importlib.import_module(module)
            cls = settings_class(module)
            env = _env(c, docs, secret="a" * 64)
            if "LLMLAB_REDIS_URL" in env:
                env["LLMLAB_REDIS_URL"] = "redis://:password@redis:6379/0"
            known = env_names(cls) | infra_env_names()
            unknown = sorted(k for k in env if k.startswith("LLMLAB_") and k not in known)
            assert not unknown, f"{workload}/{c['name']} sets variables {module} does not read: {unknown}"
            for var in [v for v in os.environ if v.startswith("LLMLAB_")]:
                monkeypatch.delenv(var)
            for var, value in env.items():
                monkeypatch.setenv(var, value)
            settings = cls()
            port = next(p["containerPort"] for p in c["ports"] if p["name"] in ("http-metrics", "engine-metrics"))
            if module == "llmlab_engine_sim":
                cli = importlib.import_module("llmlab_engine_sim.__main__")
                args = cli.parse_args(c["command"][3:])
                assert args["port"] == port and settings.host == "0.0.0.0"  # type: ignore[attr-defined]
            else:
                assert settings.port == port, f"{workload}: listens on {settings.port}, declares {port}"  # type: ignore[attr-defined]
                assert settings.host == "0.0.0.0"  # type: ignore[attr-defined]
                assert settings.infra.env == "prod" and settings.infra.nats_user  # type: ignore[attr-defined]
                assert settings.infra.namespace == "llmlab"  # type: ignore[attr-defined]
            seen.add(module)
    assert {"llmlab_gateway", "llmlab_router", "llmlab_budget", "llmlab_accounting"} <= seen
    assert {"llmlab_worker_vllm", "llmlab_worker_sglang"} <= seen


def test_probes_services_and_policies_name_ports_that_exist(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    pods = _pod_specs(docs)
    for workload, pod in pods.items():
        for c in _containers(pod):
            names = {p["name"] for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if p is None:
                    continue
                port = (p.get("httpGet") or p.get("tcpSocket"))["port"]
                assert port in names, f"{workload}/{c['name']} {probe} probes port {port!r}, not one of {names}"
            if _module(c) and _module(c) != "llmlab_engine_sim":
                assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
                assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    for svc in _of(docs, "Service"):
        sel = svc["spec"]["selector"]
        [pod] = [p for p in pods.values() if sel.items() <= p["metadata"]["labels"].items()]
        names = {p["name"] for c in _containers(pod) for p in c.get("ports", [])}
        assert all(p["targetPort"] in names for p in svc["spec"]["ports"]), svc["metadata"]["name"]
    for pol in _of(docs, "NetworkPolicy"):
        sel = pol["spec"]["podSelector"]
        targets = [p for p in pods.values() if _selects(sel, p["metadata"]["labels"])]
        assert targets or not sel, f"NetworkPolicy {pol['metadata']['name']} selects no pod"
        ports = {p.get("name") for t in targets for c in _containers(t) for p in c.get("ports", [])}
        ports |= {p["containerPort"] for t in targets for c in _containers(t) for p in c.get("ports", [])}
        for rule in pol["spec"].get("ingress", []):
            for p in rule.get("ports", []):
                assert p["port"] in ports, f"NetworkPolicy {pol['metadata']['name']}: port {p['port']} on no pod"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector:
        return True
    ok = selector.get("matchLabels", {}).items() <= labels.items()
    for e in selector.get("matchExpressions", []):
        has = e["key"] in labels
        ok = ok and (has if e["operator"] == "Exists" else has and labels[e["key"]] in e.get("values", []))
    return bool(ok)


def test_workers_serve_catalog_pools_with_their_engine_and_gpus(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = rendered
    catalog = load_catalog(DEFAULT_CATALOG)
    for name in ("worker-vllm", "worker-sglang"):
        pod = _pod_specs(docs)[name]
        worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
        [engine] = pod["spec"]["initContainers"]
        env = _env(worker, docs)
        pool = env["LLMLAB_WORKER_POOL"]
        deployments = [d for d in catalog.deployments if d.pool == pool]
        assert deployments and all(d.engine == name.removeprefix("worker-") for d in deployments)
        assert engine["restartPolicy"] == "Always", "the engine must be a native sidecar (stops after the drain)"
        [port] = [p["containerPort"] for p in engine["ports"]]
        assert env["LLMLAB_WORKER_ENGINE_URL"] == f"http://127.0.0.1:{port}"
        assert pod["metadata"]["labels"]["llmlab.io/engine-source"] == ("real" if overlay == "gpu" else "sim")
        if overlay == "gpu":
            gpus = int(engine["resources"]["limits"]["nvidia.com/gpu"])
            assert {d.gpu_count for d in deployments} == {gpus}, f"{name}: {gpus} GPUs per pod vs the catalog"
            models = {d.model for d in deployments}
            assert models <= set(engine["args"]), f"{name} serves {engine['args']}, the catalog {models}"


def test_autoscalers_read_the_queues_and_metrics_the_code_has(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    topo = Topology("llmlab")
    registered = "\n".join(p.read_text() for p in REPO.glob("services/*/llmlab_*/metrics.py"))
    pods = _pod_specs(docs)
    scaled = {}
    for so in _of(docs, "ScaledObject"):
        target = so["spec"]["scaleTargetRef"]["name"]
        scaled[target] = so
        pool = pods[target]["metadata"]["labels"].get("llmlab.io/pool")
        for t in so["spec"]["triggers"]:
            md = t["metadata"]
            if t["type"] == "nats-jetstream":
                assert (md["stream"], md["consumer"]) == (topo.requests_stream, topo.pool_consumer(pool))
                assert md["natsServerMonitoringEndpoint"].split(":")[1] == "8222"
            elif t["type"] == "prometheus":
                for metric in re.findall(r"\bllmlab_(\w+)", md["query"]):
                    assert f'"{metric}"' in registered, f"{target}: no metric llmlab_{metric} in the code"
                assert pool is None or set(re.findall(r'pool="([^"]+)"', md["query"])) == {pool}
            else:
                pytest.fail(f"unexpected trigger {t['type']}")
    assert set(scaled) == {"gateway", "worker-vllm", "worker-sglang"}
    for name in ("worker-vllm", "worker-sglang"):
        # Scale on the backlog, never on CPU: no trigger of type cpu or memory.
        assert {t["type"] for t in scaled[name]["spec"]["triggers"]} == {"prometheus", "nats-jetstream"}


def test_drains_fit_in_the_grace_period_and_rollouts_keep_capacity(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    for d in _of(docs, "Deployment"):
        pod = d["spec"]["template"]
        for c in pod["spec"]["containers"]:
            drain = next((float(v) for k, v in _env(c, docs).items() if k.endswith("_DRAIN_TIMEOUT_S")), None)
            if drain is not None:
                grace = pod["spec"]["terminationGracePeriodSeconds"]
                assert grace > drain, f"{d['metadata']['name']}: drain {drain}s does not fit in {grace}s"
                assert d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budgets = {p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] for p in _of(docs, "PodDisruptionBudget")}
    assert {"gateway", "router", "budget", "accounting", "worker-vllm", "worker-sglang"} <= budgets


def test_images_are_pinned_and_match_compose(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    compose = {svc["image"].split(":")[0]: svc["image"] for svc in SERVICES.values() if "image" in svc}
    for workload, pod in _pod_specs(docs).items():
        for c in _containers(pod):
            image, _, tag = c["image"].partition(":")
            assert tag and tag != "latest", f"{workload}/{c['name']}: image {c['image']} is not pinned"
            if image == OUR_IMAGE:  # compose builds it locally (:dev); the cluster pulls a release
                continue
            if image in compose and image not in ("nats", "redis"):
                assert c["image"] == compose[image], f"{workload}: {c['image']}, compose runs {compose[image]}"
            elif image in compose:  # compose follows a minor line; the cluster pins a patch of it
                assert tag.startswith(compose[image].split(":")[1].split("-")[0].removesuffix(".x"))


def test_secrets_the_manifests_need_are_documented(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    readme = (REPO / "infra" / "k8s" / "README.md").read_text()
    wanted = set()
    for pod in _pod_specs(docs).values():
        for c in _containers(pod):
            wanted |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", []) if "valueFrom" in e}
        wanted |= {v["secret"]["secretName"] for v in pod["spec"].get("volumes", []) if "secret" in v}
    assert wanted and all(f"`{s}`" in readme for s in wanted), sorted(s for s in wanted if f"`{s}`" not in readme)


def test_prometheus_jobs_are_those_of_compose() -> None:
    """Rules and alerts select by job: the cluster's jobs must be the compose stack's (plus nats,
    whose exporter only the cluster runs)."""
    compose_jobs = {
        j["job_name"]
        for j in yaml.safe_load((REPO / "infra" / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]
    }
    docs = k8s.render("gpu")
    labels = [p["metadata"]["labels"] for p in _pod_specs(docs).values()]
    pod_jobs = {lb["llmlab.io/job"] for lb in labels if "llmlab.io/job" in lb}
    assert pod_jobs | {"engines"} <= compose_jobs | {"nats"}
    assert {"gateway", "workers", "budget", "router", "accounting"} <= pod_jobs
