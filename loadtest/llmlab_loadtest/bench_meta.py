"""The metadata block every benchmark and experiment writes beside its results (MISSION.md,
"Rules for every benchmark": the §12 fields; a field that does not apply says why)."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import json
import logging
import os
import platform
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)

SIMULATED_NOTE = (
    "All figures come from the engine simulator (fixed TTFT/ITL timing on the CPU), not a GPU: "
    "they measure the serving stack, not model serving performance."
)


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# The vector instructions that set an engine's speed on a CPU. The hosts these runs land on differ between
# sessions with the same "model name" ("AMD EPYC": an AVX2-only host and an AVX-512 + bf16 one ran vLLM at 103 and
# 45 ms per token), so results are compared only where this field matches.
# avx512_vp2intersect tells the Zen 5 hosts from the Zen 4 ones (both AVX-512 with bf16, vLLM's decode about twice
# as fast on Zen 5): configs/hardware.yaml has a twin device per class.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vp2intersect", "amx_bf16")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (with its family and model numbers where /proc/cpuinfo gives them: a VM's "AMD EPYC"
    names several generations), cores and vector ISA (from ``/proc/cpuinfo``, or the text given)."""
    model = "unknown"
    family = number = None
    flags: set[str] = set()
    if cpuinfo is None:
        with contextlib.suppress(OSError):
            cpuinfo = Path("/proc/cpuinfo").read_text()
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and model == "unknown":
            model = value
        elif key == "cpu family" and family is None:
            family = value
        elif key == "model" and number is None:
            number = value
        elif key == "flags" and not flags:
            flags = set(value.split())
    if family is not None and number is not None:
        model += f" (family {family} model {number})"
    isa = "+".join(f for f in ISA_FLAGS if f in flags) or "no AVX2"
    return (
        f"{model}, {psutil.cpu_count(logical=True)} logical cores ({psutil.cpu_count(logical=False)} physical), {isa}"
    )


def metadata_cores(meta: dict[str, Any]) -> int | None:
    """The logical cores a result's metadata names in its ``cpu`` field (:func:`cpu_model`'s "..., 2 logical
    cores (2 physical), avx2+..."; before the ISA was added the field ended with the cores)."""
    m = re.search(r"(\d+) logical cores", str(meta.get("cpu", "")))
    return int(m.group(1)) if m else None


def dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# The §12 fields every benchmark writes (MISSION.md, rules for every benchmark), plus ours.
METADATA_FIELDS = (
    "date",
    "git_commit",
    "git_dirty",
    "model_id",
    "model_revision",
    "engine",
    "engine_version",
    "container_image",
    "gpu",
    "gpu_count",
    "driver",
    "cuda_or_rocm",
    "cpu",
    "ram",
    "prompt_dataset",
    "input_length_distribution",
    "output_length_distribution",
    "concurrency",
    "warmup",
    "duration",
    "sampling_parameters",
    "simulated",
    "command_line",
)


OUTPUT_DIRS = ("results/", "reports/")  # what benchmarks write (the results index is tracked): not code


def dirty_files() -> list[str]:
    """Tracked files that differ from HEAD, outside the benchmarks' own outputs (a run's new result
    files and the index it rewrites do not make the code it ran differ)."""
    lines = git("status", "--porcelain", "--untracked-files=no").splitlines()
    return [ln for ln in lines if ln.strip() and not ln.split(maxsplit=1)[-1].startswith(OUTPUT_DIRS)]


def require_committed(allow_dirty: bool) -> list[str]:
    """A benchmark measures a committed tree: exits when tracked files differ from HEAD, unless
    ``allow_dirty`` (``--dirty``); returns the differing files for the metadata."""
    # porcelain lines are "XY path"; git() strips the first line's leading blank
    dirty = [line.split(maxsplit=1)[-1] for line in dirty_files()]
    if dirty and not allow_dirty:
        raise SystemExit(
            f"refusing to benchmark a modified tree ({len(dirty)} tracked files differ from HEAD: "
            f"{', '.join(dirty[:5])}); commit, or pass --dirty and the result says so"
        )
    return dirty


# Settings whose values a result must not carry (passwords, keys, tokens); a URL's credentials too.
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN$|_KEY$|_KEYS$|CREDENTIAL", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def service_settings(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The ``LLMLAB_*`` variables of the benchmark's environment: every process it starts inherits
    them, so a run made with a setting changed (``LLMLAB_WORKER_PUBLISH_BATCH_MS=5 make bench``)
    says so. Secrets are replaced by ``<redacted>``, a URL's credentials dropped."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for key in sorted(k for k in env if k.startswith("LLMLAB_")):
        out[key] = "<redacted>" if _SECRET_NAME.search(key) else _URL_USERINFO.sub("<redacted>@", env[key])
    return out


def metadata_block(
    *,
    started: dt.datetime,
    duration_s: float,
    engine: str,
    model_id: str,
    concurrency: Any,
    warmup: str,
    prompt_dataset: str,
    input_length_distribution: str,
    output_length_distribution: str,
    sampling_parameters: Any,
    command: str,
    simulated: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    # Tracked files only: a run's own outputs (new result files) do not make the code it ran differ.
    dirty = dirty_files()
    out: dict[str, Any] = {
        "date": started.isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD") or "unknown",
        "git_dirty": bool(dirty),
        "model_id": model_id,
        "model_revision": "n/a (simulator: no weights are loaded; the name is only served)" if simulated else "unknown",
        "engine": engine,
        "engine_version": f"llmlab-engine-sim {dist_version('llmlab-engine-sim')}" if simulated else "unknown",
        "container_image": "n/a (processes run on the host from the repository venv)",
        "gpu": "none (simulated)" if simulated else "unknown",
        "gpu_count": 0,
        "driver": "n/a (no GPU)",
        "cuda_or_rocm": "n/a (no GPU)",
        "cpu": cpu_model(),
        "ram": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "prompt_dataset": prompt_dataset,
        "input_length_distribution": input_length_distribution,
        "output_length_distribution": output_length_distribution,
        "concurrency": concurrency,
        "warmup": warmup,
        "duration": f"{duration_s:.0f} s",
        "sampling_parameters": sampling_parameters,
        "simulated": simulated,
        "python": platform.python_version(),
        "command_line": command,
        "settings_from_environment": service_settings(),
    }
    if simulated:
        out["simulated_note"] = SIMULATED_NOTE
    out.update(extra)
    return out


def metadata_section(meta: dict[str, Any], heading: str = "## Metadata") -> list[str]:
    """The metadata block as a Markdown section (a JSON code block under ``heading``)."""
    return [heading, "", "```json", json.dumps(meta, indent=1), "```", ""]


def write_outputs(
    doc: dict[str, Any],
    out_dir: Path,
    started: dt.datetime,
    prefix: str,
    markdown: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], None],
) -> dict[str, Path]:
    """``<out_dir>/<prefix>/<UTC>/result.{json,md,png}``, then ``<out_dir>/<prefix>/latest`` points
    at the run (a relative symlink) and ``<out_dir>/README.md`` indexes every benchmark; a failed
    plot leaves the JSON and Markdown."""
    run_dir = out_dir / prefix / started.strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: run_dir / f"result.{ext}" for ext in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(doc, indent=1))
    paths["md"].write_text(markdown(doc))
    try:
        plot(doc, paths["png"])
    except Exception:
        log.exception("plot failed (the JSON and Markdown are written)")
        paths.pop("png")
    paths["latest"] = point_latest(run_dir)
    write_index(out_dir)
    return paths


def point_latest(run_dir: Path) -> Path:
    """``<run_dir>/../latest`` points at ``run_dir`` (a relative symlink)."""
    latest = run_dir.parent / LATEST
    tmp = latest.with_name(LATEST + ".tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir.name)
    tmp.replace(latest)  # atomic: a reader sees the old run or the new one
    return latest


LATEST = "latest"
_RUN = re.compile(r"^\d{8}(T\d{6}Z)?$")


def index_markdown(out_dir: Path) -> str:
    """The index of ``results/``: one line per benchmark folder (its runs, its latest run) and the
    files kept at the top level. Runs are ``<bench>/<UTC timestamp or date>/``."""
    lines = [
        "# Results",
        "",
        "Written by `make bench`, `make experiments` and the lab tools; one folder per benchmark or",
        "experiment, one folder per run inside (`<UTC timestamp>` or `<date>`) with its `result.json`,",
        "`result.md` and `result.png` (studies keep their own files), and `latest` pointing at the newest",
        "run. This index is rewritten by every benchmark run (`llmlab_loadtest.bench_meta.write_index`);",
        "`loadtest/tests/test_results_layout.py` keeps it current.",
        "",
        "| benchmark | runs | latest |",
        "|---|---:|---|",
    ]
    loose = []
    for d in sorted(out_dir.iterdir()):
        if d.name in ("README.md", "tmp"):  # tmp/: work files of the runs, not kept (.gitignore)
            continue
        if not d.is_dir():
            loose.append(d.name)
            continue
        runs = sorted(r.name for r in d.iterdir() if r.is_dir() and not r.is_symlink() and _RUN.match(r.name))
        link = d / LATEST
        latest = os.readlink(link) if link.is_symlink() else (runs[-1] if runs else "")
        lines.append(f"| `{d.name}/` | {len(runs) or 'one, in place'} | {f'`{latest}`' if latest else '—'} |")
    if loose:
        lines += ["", "Single files of tools that overwrite them: " + ", ".join(f"`{n}`" for n in loose) + "."]
    return "\n".join(lines) + "\n"


def write_index(out_dir: Path) -> Path:
    path = out_dir / "README.md"
    path.write_text(index_markdown(out_dir))
    return path
