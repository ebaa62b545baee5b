"""Static checks of the container files, which cannot run here (no Docker engine on this machine):
docker-compose.yml, Dockerfile, infra/* and scripts/gpu-smoke.sh.

What a typo would otherwise only show on someone's Docker host: a service module that does not
exist, an LLMLAB_* variable that no settings class reads (pydantic-settings ignores unknown
variables silently), a Prometheus target or engine URL naming a service or port that is not
there, a dependency without a healthcheck, Redis without its append-only file.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic_settings import BaseSettings

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
PROMETHEUS_FILE = REPO / "infra" / "prometheus" / "prometheus.yml"
REDIS_CONF = REPO / "infra" / "redis" / "redis.conf"
NATS_CONF = REPO / "infra" / "nats" / "nats.conf"
DOCKERFILE = REPO / "Dockerfile"
GPU_SMOKE = REPO / "scripts" / "gpu-smoke.sh"

OUR_IMAGE = "llm-inference-lab"
# Module run by a compose service -> the settings class that reads its LLMLAB_<SERVICE>_* vars.
SETTINGS_OF_MODULE = {
    "llmlab_gateway": ("llmlab_gateway.settings", "GatewaySettings"),
    "llmlab_worker_vllm": ("llmlab_worker.settings", "WorkerSettings"),
    "llmlab_worker_sglang": ("llmlab_worker.settings", "WorkerSettings"),
    "llmlab_engine_sim": ("llmlab_engine_sim.settings", "SimSettings"),
    "llmlab_budget": ("llmlab_budget.settings", "BudgetSettings"),
    "llmlab_router": ("llmlab_router.settings", "RouterSettings"),
    "llmlab_accounting": ("llmlab_accounting.settings", "AccountingSettings"),
}
EXPECTED_SERVICES = {
    "nats",
    "redis",
    "prometheus",
    "sim-vllm",
    "sim-sglang",
    "worker-vllm",
    "worker-sglang",
    "budget",
    "router",
    "accounting",
    "gateway",
}
GPU_SERVICES = {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang"}
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")
_PROBE_URL = re.compile(r"http://127\.0\.0\.1:(\d+)(/[\w/.-]*)")


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


COMPOSE: dict[str, Any] = _load(COMPOSE_FILE)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def _ours(svc: dict[str, Any]) -> bool:
    return "build" in svc or str(svc.get("image", "")).split(":")[0] == OUR_IMAGE


OUR_SERVICES = sorted(name for name, svc in SERVICES.items() if _ours(svc))


def resolve(value: str) -> str:
    """A compose value as Compose uses it with none of its variables set: ``${X:-d}`` -> ``d``."""
    return _INTERPOLATION.sub(lambda m: m.group(2) or "", value)


def env_of(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): resolve(str(v)) for k, v in env.items()}


def module_of(svc: dict[str, Any]) -> str:
    cmd = svc.get("command")
    assert isinstance(cmd, list), f"command should be a list (exec form), got {cmd!r}"
    assert cmd[:2] == ["python", "-m"] and len(cmd) >= 3, f"not `python -m <module>`: {cmd}"
    return str(cmd[2])


def exposed_ports(svc: dict[str, Any]) -> set[int]:
    """Ports the container listens on, as declared: ``expose`` and the container side of ``ports``."""
    ports = {int(str(p).split("/")[0]) for p in svc.get("expose", [])}
    for p in svc.get("ports", []):
        target = p.get("target") if isinstance(p, dict) else str(p).rsplit(":", 1)[-1]
        ports.add(int(str(target).split("/")[0]))
    return ports


def settings_class(module: str) -> type[BaseSettings]:
    mod_name, cls_name = SETTINGS_OF_MODULE[module]
    mod = importlib.import_module(mod_name)
    cls = getattr(mod, cls_name)
    assert issubclass(cls, BaseSettings)
    return cls


def env_names(cls: type[BaseSettings]) -> set[str]:
    """The variables a settings class reads: env prefix + field name (nested ``infra`` excluded)."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    return {f"{prefix}{field}".upper() for field in cls.model_fields if field != "infra"}


def infra_env_names() -> set[str]:
    from llmlab_common.settings import InfraSettings

    return env_names(InfraSettings)


def service_port(name: str) -> int:
    """The port a service of ours listens on, from its env (gateway/workers) or --port (simulator)."""
    svc = SERVICES[name]
    env = env_of(svc)
    for var in ("LLMLAB_GATEWAY_PORT", "LLMLAB_WORKER_PORT", "LLMLAB_SIM_PORT"):
        if var in env:
            return int(env[var])
    cmd = [str(c) for c in svc["command"]]
    if "--port" in cmd:
        return int(cmd[cmd.index("--port") + 1])
    cls = settings_class(module_of(svc))
    return int(cls.model_fields["port"].default)


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port, f"{url!r} needs a host and a port"
    return parts.hostname, parts.port


def assert_service_port(host: str, port: int, what: str) -> None:
    assert host in SERVICES, f"{what}: no compose service named {host!r}"
    assert port in exposed_ports(SERVICES[host]), f"{what}: {host} does not declare port {port}"


# -- docker-compose.yml ------------------------------------------------------------------------


def test_compose_has_the_stack_and_the_gpu_profile() -> None:
    assert set(SERVICES) >= EXPECTED_SERVICES, EXPECTED_SERVICES - set(SERVICES)
    for name in EXPECTED_SERVICES:
        assert "profiles" not in SERVICES[name], f"{name} must start with a plain `docker compose up`"
    assert set(OUR_SERVICES) == {
        "sim-vllm",
        "sim-sglang",
        "worker-vllm",
        "worker-sglang",
        "budget",
        "router",
        "accounting",
        "gateway",
    }
    for name, image in GPU_SERVICES.items():
        svc = SERVICES[name]
        assert svc["profiles"] == ["gpu"]
        assert svc["image"].startswith(image)
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices and all(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert SERVICES["nats"]["image"].startswith("nats:2.10")
    assert "-js" in SERVICES["nats"]["command"]
    assert SERVICES["redis"]["image"].startswith("redis:7")
    assert SERVICES["prometheus"]["image"].startswith("prom/prometheus")


@pytest.mark.parametrize("name", OUR_SERVICES)
def test_our_services_run_an_importable_llmlab_module(name: str) -> None:
    module = module_of(SERVICES[name])
    assert module.startswith("llmlab_"), module
    assert importlib.util.find_spec(module) is not None, f"{name}: module {module} is not importable"
    assert importlib.util.find_spec(f"{module}.__main__") is not None, f"{name}: {module} has no __main__"
    assert module in SETTINGS_OF_MODULE, f"{name}: no settings class known for {module}"


@pytest.mark.parametrize("name", OUR_SERVICES)
def test_llmlab_env_vars_are_settings_fields(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = SERVICES[name]
    cls = settings_class(module_of(svc))
    known = env_names(cls) | infra_env_names()
    env = {k: v for k, v in env_of(svc).items() if k.startswith("LLMLAB_")}
    unknown = sorted(set(env) - known)
    assert not unknown, f"{name} sets variables no settings class reads: {unknown} (known: {sorted(known)})"
    # And the values parse: build the settings from exactly this environment.
    for var in list(os.environ):
        if var.startswith("LLMLAB_"):
            monkeypatch.delenv(var)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    settings = cls()
    infra = settings.infra  # type: ignore[attr-defined]
    assert settings.host == "0.0.0.0", f"{name} must listen on all interfaces in its container"  # type: ignore[attr-defined]
    if module_of(svc) != "llmlab_engine_sim":
        assert infra.nats_url == "nats://nats:4222"
        assert infra.env == "dev"
        assert str(infra.catalog_path) == "/app/configs/catalog.yaml"


def test_simulator_flags_are_accepted_by_its_cli() -> None:
    cli = importlib.import_module("llmlab_engine_sim.__main__")
    sim_settings = settings_class("llmlab_engine_sim")
    for name in ("sim-vllm", "sim-sglang"):
        argv = [str(a) for a in SERVICES[name]["command"][3:]]
        try:
            args = cli.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{name}: python -m llmlab_engine_sim rejects {argv}")
        settings = sim_settings(**args)
        assert settings.flavor == name.removeprefix("sim-")  # type: ignore[attr-defined]


def test_worker_engine_urls_point_at_the_simulators() -> None:
    for worker, sim in (("worker-vllm", "sim-vllm"), ("worker-sglang", "sim-sglang")):
        host, port = host_port(env_of(SERVICES[worker])["LLMLAB_WORKER_ENGINE_URL"])
        assert host == sim
        assert port == service_port(sim)
        assert_service_port(host, port, f"{worker} engine URL")
        # The gpu-profile URL documented in the file points at a real engine service and port.
        raw = str(SERVICES[worker]["environment"]["LLMLAB_WORKER_ENGINE_URL"])
        var = _INTERPOLATION.match(raw)
        assert var, f"{worker}: engine URL should be overridable (${{VAR:-default}}), got {raw!r}"
        gpu_urls = re.findall(rf"{var.group(1)}=(http://[\w.-]+:\d+)", COMPOSE_FILE.read_text())
        assert gpu_urls, f"the compose header should show {var.group(1)}=... for the gpu profile"
        for url in gpu_urls:
            gpu_host, gpu_port = host_port(url)
            assert gpu_host in GPU_SERVICES
            assert_service_port(gpu_host, gpu_port, f"{var.group(1)}")


def test_infra_urls_point_at_services() -> None:
    for name in OUR_SERVICES:
        env = env_of(SERVICES[name])
        for var, service in (("LLMLAB_NATS_URL", "nats"), ("LLMLAB_REDIS_URL", "redis")):
            if var in env:
                host, port = host_port(env[var])
                assert host == service
                assert_service_port(host, port, f"{name} {var}")


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_healthchecks_probe_the_declared_port(name: str) -> None:
    svc = SERVICES[name]
    check = svc.get("healthcheck")
    assert check and check.get("test"), f"{name} has no healthcheck"
    test = check["test"]
    assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL"), test
    probe = " ".join(str(t) for t in test)
    if name == "redis":
        assert "redis-cli" in probe
        return
    m = _PROBE_URL.search(probe)
    assert m, f"{name}: healthcheck does not probe an HTTP endpoint: {probe}"
    port, path = int(m.group(1)), m.group(2)
    assert port in exposed_ports(svc), f"{name}: probes port {port}, not declared"
    if name in OUR_SERVICES:
        assert port == service_port(name), f"{name}: probes {port} but listens on {service_port(name)}"
        expected = "/health" if module_of(svc) == "llmlab_engine_sim" else "/ready"
        assert path == expected, f"{name}: probe {path}, expected {expected}"
    elif name in GPU_SERVICES or name == "nats":
        assert path in ("/health", "/healthz")


def test_depends_on_waits_for_healthy_services() -> None:
    for name, svc in SERVICES.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: use the long depends_on form with a condition"
        for dep, spec in deps.items():
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
            assert spec.get("condition") == "service_healthy", f"{name} -> {dep}"
            assert SERVICES[dep].get("healthcheck"), f"{name} waits for {dep}, which has no healthcheck"
            assert "profiles" not in SERVICES[dep], f"{name} depends on {dep} of an optional profile"
    assert {"nats", "worker-vllm", "worker-sglang"} <= set(SERVICES["gateway"]["depends_on"])
    assert "nats" in SERVICES["worker-vllm"]["depends_on"] and "sim-vllm" in SERVICES["worker-vllm"]["depends_on"]
    assert "nats" in SERVICES["worker-sglang"]["depends_on"] and "sim-sglang" in SERVICES["worker-sglang"]["depends_on"]


def test_mounted_config_files_exist() -> None:
    for name, svc in SERVICES.items():
        for volume in svc.get("volumes", []):
            source = str(volume).split(":", 1)[0]
            if source.startswith("./"):
                # A file, or a directory of them (rules, dashboards, provisioning) that is not empty.
                path = REPO / source
                assert path.is_file() or (path.is_dir() and any(path.iterdir())), f"{name} mounts missing {source}"
            elif not source.startswith(("/", "$", "~")):
                assert source in (COMPOSE.get("volumes") or {}), f"{name}: named volume {source} not declared"


def test_dockerfile_installs_every_package_the_services_run() -> None:
    text = "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#"))
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^USER (?!root\b)\S+", text, re.M), "the image must not run as root"
    installed = [re.sub(r"\[.*\]$", "", p) for p in re.findall(r"^\s+\./(\S+?)\s*\\?$", text, re.M)]
    assert installed, "the Dockerfile installs no package of the repository"
    names = {}
    for path in installed:
        assert (REPO / path / "pyproject.toml").is_file(), f"Dockerfile installs {path}, which has no pyproject"
        names[tomllib.loads((REPO / path / "pyproject.toml").read_text())["project"]["name"]] = path
    for path in installed:  # every library a package depends on is installed with it (none is on PyPI)
        deps = tomllib.loads((REPO / path / "pyproject.toml").read_text())["project"]["dependencies"]
        local = {re.split(r"[\[<>=]", d)[0] for d in deps if d.startswith("llmlab-")}
        assert local <= set(names), f"{path} needs {sorted(local - set(names))}, which the Dockerfile does not install"
    for name in OUR_SERVICES:
        module = module_of(SERVICES[name])
        spec = importlib.util.find_spec(module)
        assert spec and spec.origin
        package_dir = Path(spec.origin).resolve().parents[1].relative_to(REPO).as_posix()
        assert package_dir in installed, f"{name} runs {module} from {package_dir}, not installed by the Dockerfile"


# -- infra/ ---------------------------------------------------------------------------------------


def test_prometheus_scrapes_the_services_that_exist() -> None:
    prom = _load(PROMETHEUS_FILE)
    assert prom["global"]["scrape_interval"] == "5s"
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    assert set(jobs) == {"gateway", "workers", "engines", "budget", "router", "accounting"}
    scraped: dict[str, set[str]] = {}
    for job_name, job in jobs.items():
        assert job.get("metrics_path", "/metrics") == "/metrics"
        assert job.get("scrape_interval", "5s") == "5s"
        for group in job["static_configs"]:
            for target in group["targets"]:
                host, port = target.rsplit(":", 1)
                assert_service_port(host, int(port), f"prometheus job {job_name} target {target}")
                if host in OUR_SERVICES:
                    assert int(port) == service_port(host), f"{target}: {host} listens on {service_port(host)}"
                scraped.setdefault(job_name, set()).add(host)
    assert scraped["gateway"] == {"gateway"}
    assert scraped["workers"] == {"worker-vllm", "worker-sglang"}
    assert {"sim-vllm", "sim-sglang"} <= scraped["engines"]
    for svc in ("budget", "router", "accounting"):
        assert scraped[svc] == {svc}


def test_redis_keeps_an_append_only_file() -> None:
    settings: dict[str, str] = {}
    for line in REDIS_CONF.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            settings[key.lower()] = value.strip()
    assert settings.get("appendonly") == "yes"
    assert settings.get("appendfsync") == "everysec"
    assert settings.get("maxmemory-policy") == "noeviction"
    assert settings.get("dir") == "/data"
    assert "/data" in {str(v).split(":")[1] for v in SERVICES["redis"]["volumes"]}


def test_nats_enables_jetstream_on_the_volume() -> None:
    text = re.sub(r"#.*", "", NATS_CONF.read_text())
    assert re.search(r"^\s*port:\s*4222\s*$", text, re.M)
    assert re.search(r"^\s*http_port:\s*8222\s*$", text, re.M)
    block = re.search(r"jetstream\s*\{([^}]*)\}", text)
    assert block, "no jetstream block"
    store = re.search(r'store_dir:\s*"?([^"\s]+)"?', block.group(1))
    assert store and store.group(1) == "/data"
    assert "max_file_store" in block.group(1) and "max_memory_store" in block.group(1)
    assert "/data" in {str(v).split(":")[1] for v in SERVICES["nats"]["volumes"]}


# -- scripts/ --------------------------------------------------------------------------------------


def test_gpu_smoke_script_parses_and_says_it_is_unverified() -> None:
    proc = subprocess.run(["bash", "-n", str(GPU_SMOKE)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    text = GPU_SMOKE.read_text()
    assert "UNVERIFIED: written without a GPU; it has not been run yet." in text
    assert "set -euo pipefail" in text
    for needle in ("LLMLAB_GPU_ENGINE=", "LLMLAB_GPU_ENGINE_URL=", "LLMLAB_GPU_MODEL=", "-m gpu", "tests/gpu"):
        assert needle in text, needle
