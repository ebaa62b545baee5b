from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from llmlab_loadtest.bench_meta import METADATA_FIELDS

QuickRun = tuple[Path, dict[str, Any], subprocess.CompletedProcess[str]]


@pytest.fixture
def quick_bench(tmp_path: Path) -> Callable[..., QuickRun]:
    """Run a benchmark module (``python -m llmlab_loadtest.<bench>``) with ``--quick`` into
    ``tmp_path`` and check what every benchmark writes: one ``<prefix>/<ts>/result.json`` with
    its ``.md`` and ``.png``, and a metadata block with every required field filled.
    Returns (the JSON's path, its document, the process)."""

    def run(
        bench: str,
        prefix: str,
        out_flag: str = "--out",
        timeout: float = 300,
        extra_fields: Sequence[str] = (),
        args: Sequence[str] = (),
    ) -> QuickRun:
        proc = subprocess.run(
            [sys.executable, "-m", f"llmlab_loadtest.{bench}", "--quick", out_flag, str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        stamped = sorted(tmp_path.glob(f"{prefix}/2*/result.json"))
        assert len(stamped) == 1
        assert stamped[0].with_suffix(".md").exists() and stamped[0].with_suffix(".png").exists()
        # The benchmark's latest pointer is this run, and the index lists the benchmark.
        assert (tmp_path / prefix / "latest").resolve() == stamped[0].parent.resolve()
        assert f"| `{prefix}/` | 1 | `{stamped[0].parent.name}` |" in (tmp_path / "README.md").read_text()
        doc = json.loads(stamped[0].read_text())
        meta = doc["metadata"]
        for key in (*METADATA_FIELDS, *extra_fields):
            assert key in meta and meta[key] not in (None, ""), key
        assert "--quick" in meta["command_line"]
        return stamped[0], doc, proc

    return run
