"""The Kubernetes manifests of ``infra/k8s``, checked offline: rendered by kustomize, every object
validated against the Kubernetes API schema of a stated version (kubernetes-validate) and the
custom resources (KEDA's ScaledObject, the Prometheus Operator's PodMonitor) against their CRD
schemas vendored in ``infra/k8s/schemas``. No cluster runs here; this is what can be checked
without one.

    python -m llmlab_lab.k8s validate           # make k8s-validate: both overlays
    python -m llmlab_lab.k8s sync               # make k8s-sync: refresh base/files from infra/
    python -m llmlab_lab.k8s vendor-crd CRD.yaml --source "kedacore/keda v2.20.2 <commit> <path>"
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

log = logging.getLogger("llmlab_lab.k8s")

# The checkout: this file's, or the working directory when this module runs from a copy (the
# mutation runner imports a broken copy of the package from a temporary directory).
REPO = next(p for p in (Path(__file__).resolve().parents[2], Path.cwd()) if (p / "infra" / "k8s").is_dir())
K8S = REPO / "infra" / "k8s"
OVERLAYS = ("cpu-sim", "gpu")
SCHEMAS = K8S / "schemas"
# The Kubernetes release the manifests are written for: native sidecars (init containers with
# restartPolicy Always) need 1.29 or later; 1.32 is what kubectl on these machines carries.
KUBERNETES_VERSION = "1.32.0"
# Where each copied file of base/files comes from (kustomize reads only below its own folder).
SYNCED = {
    "redis.conf": "infra/redis/redis.conf",
    "recording.yml": "infra/prometheus/rules/recording.yml",
    "alerts.yml": "infra/prometheus/rules/alerts.yml",
    "alertmanager.yml": "infra/alertmanager/alertmanager.yml",
    "grafana-datasource.yml": "infra/grafana/provisioning/datasources/prometheus.yml",
    "grafana-dashboard-provider.yml": "infra/grafana/provisioning/dashboards/llmlab.yml",
    "llmlab-latency.json": "infra/grafana/dashboards/llmlab-latency.json",
    "llmlab-operations.json": "infra/grafana/dashboards/llmlab-operations.json",
}


def render(overlay: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize infra/k8s/overlays/<overlay>`` renders (kubectl's built-in
    kustomize: what ``kubectl apply -k`` applies)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl not found: it renders the kustomizations (its built-in kustomize)")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"kustomize failed for {overlay}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _schema_file(api_version: str, kind: str) -> Path:
    group, _, version = api_version.rpartition("/")
    return SCHEMAS / f"{kind.lower()}_{group}_{version}.json"


def _strict(schema: Any) -> Any:
    """A CRD's openAPIV3Schema made to refuse unknown fields, as the API server's strict field
    validation does (kubectl's default): objects with declared properties and no
    ``additionalProperties`` or ``x-kubernetes-preserve-unknown-fields`` take no others."""
    if isinstance(schema, dict):
        s = {k: _strict(v) for k, v in schema.items()}
        if "properties" in s and "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
        return s
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def custom_resource_errors(doc: dict[str, Any]) -> list[str]:
    """Validation errors of a custom resource against its vendored CRD schema."""
    path = _schema_file(doc["apiVersion"], doc["kind"])
    if not path.is_file():
        return [f"no vendored schema for {doc['apiVersion']} {doc['kind']} ({path.name})"]
    schema = json.loads(path.read_text())["schema"]
    # ObjectMeta is the API server's to check; the CRD schema leaves it open.
    validator = jsonschema.Draft7Validator(_strict(schema))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)]


def errors(docs: Iterable[dict[str, Any]], version: str = KUBERNETES_VERSION) -> list[str]:
    """Every validation error of ``docs``, each prefixed with its object's kind and name."""
    found: list[str] = []
    for doc in docs:
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if _schema_file(doc["apiVersion"], doc["kind"]).is_file():
            found += [f"{name}: {e}" for e in custom_resource_errors(doc)]
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            found.append(f"{name}: {'.'.join(map(str, exc.path)) or '<root>'}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            found.append(f"{name}: no schema for {doc['apiVersion']} {doc['kind']} in Kubernetes {version}")
    return found


def vendor_crd(crd_path: Path, source: str, out_dir: Path = SCHEMAS) -> list[Path]:
    """Write one JSON schema per served version of a CRD (its openAPIV3Schema), with where it
    came from; returns the files written."""
    crd = yaml.safe_load(crd_path.read_text())
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    written = []
    for v in crd["spec"]["versions"]:
        if not v.get("served"):
            continue
        path = out_dir / f"{kind.lower()}_{group}_{v['name']}.json"
        doc = {"source": source, "apiVersion": f"{group}/{v['name']}", "kind": kind}
        doc["schema"] = copy.deepcopy(v["schema"]["openAPIV3Schema"])
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        written.append(path)
    return written


def stale_copies() -> list[str]:
    """The files of base/files that differ from their original in infra/ (or are missing)."""
    files = K8S / "base" / "files"
    return [
        f"{name} (from {src})"
        for name, src in SYNCED.items()
        if not (files / name).is_file() or (files / name).read_bytes() != (REPO / src).read_bytes()
    ]


def sync() -> None:
    for name, src in SYNCED.items():
        shutil.copyfile(REPO / src, K8S / "base" / "files" / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab_lab.k8s", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="render each overlay and validate every object")
    v.add_argument("--overlay", action="append", choices=OVERLAYS, help="default: all")
    sub.add_parser("sync", help="copy infra/'s config files into infra/k8s/base/files")
    c = sub.add_parser("vendor-crd", help="vendor a CRD's schemas into infra/k8s/schemas")
    c.add_argument("crd", type=Path)
    c.add_argument("--source", required=True, help="project, release, commit and path it came from")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.cmd == "sync":
        sync()
        log.info("infra/k8s/base/files refreshed (%d files)", len(SYNCED))
        return 0
    if a.cmd == "vendor-crd":
        for p in vendor_crd(a.crd, a.source):
            log.info("wrote %s", p.relative_to(REPO))
        return 0
    failed = False
    stale = stale_copies()
    if stale:
        log.error("infra/k8s/base/files is stale (make k8s-sync): %s", ", ".join(stale))
        failed = True
    for overlay in a.overlay or OVERLAYS:
        docs = render(overlay)
        errs = errors(docs)
        kinds = sorted({d["kind"] for d in docs})
        log.info(
            "%s: %d objects (%s), Kubernetes %s: %s",
            overlay,
            len(docs),
            ", ".join(kinds),
            KUBERNETES_VERSION,
            "valid" if not errs else f"{len(errs)} errors",
        )
        for e in errs:
            log.error("  %s", e)
        failed = failed or bool(errs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
