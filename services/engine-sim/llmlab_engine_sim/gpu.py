"""Simulated GPU gauges under dcgm-exporter's names (``DCGM_FI_DEV_*``, labels ``gpu``,
``modelName`` and ``simulated="true"``), so that the rules and dashboards written for a GPU host
read the simulator the same way. All **simulated**: no GPU is read. Everything is computed at
scrape time from what the scheduler already keeps; nothing runs per token or per step.

* utilisation (%): the twin's busy share of time since the previous window (``--mode twin``,
  :class:`llmlab_engine_sim.twin_rt.TwinGpuCollector`); in the fixed-latency mode, which has no
  step times, the running batch's share of ``max_num_seqs`` averaged over the window (mean batch =
  generated tokens x ITL / elapsed time), :class:`FixedGpuCollector`;
* framebuffer used / free (MiB): weights + KV cache in use, out of the device's memory (the KV
  calculator's figures for ``twin_model`` on ``twin_device``; an H100 80 GB with no weights when
  that pair is unknown);
* power (W): idle + utilisation x (TDP - idle), per ``twin_device`` or ``tdp_w`` / ``idle_w``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from llmlab_twin import kvcalc
from prometheus_client.core import GaugeMetricFamily

from llmlab_engine_sim.flavors import KV_BLOCK_SIZE, EngineMetrics
from llmlab_engine_sim.settings import SimSettings

if TYPE_CHECKING:
    from llmlab_engine_sim.scheduler import LoopScheduler

log = logging.getLogger(__name__)

# Board power (W) when hardware.yaml has none: datasheet TDPs; idle is a stated assumption (about
# 10-15% of TDP for an idle data-centre GPU with a model loaded).
DEFAULT_POWER_W: dict[str, tuple[float, float]] = {
    "H100-SXM": (700.0, 90.0),
    "H100-PCIe": (350.0, 60.0),
    "H200": (700.0, 90.0),
    "A100-80GB": (400.0, 60.0),
    "L40S": (350.0, 40.0),
    "L4": (72.0, 16.0),
}
FALLBACK_MEMORY_BYTES = 80 * 10**9  # an H100 80 GB, when the KV calculator knows neither model nor device
UTIL_WINDOW_S = 0.5  # a scrape sooner than this after the previous window repeats its figure
_MIB = 2**20


class GpuProfile:
    """The simulated device's fixed figures: memory (device, weights, KV bytes per token) and power."""

    def __init__(self, settings: SimSettings) -> None:
        self.labels = {"gpu": "0", "modelName": settings.twin_device, "simulated": "true"}
        tdp, idle = DEFAULT_POWER_W.get(settings.twin_device, (700.0, 90.0))
        self.tdp_w = settings.tdp_w if settings.tdp_w is not None else tdp
        self.idle_w = settings.idle_w if settings.idle_w is not None else idle
        self.gpu_memory_utilization = settings.gpu_memory_utilization
        self.weight_bytes = 0.0
        self.kv_bytes_per_token = 0.0
        self.total_bytes = float(FALLBACK_MEMORY_BYTES)
        try:
            p = kvcalc.plan_by_name(settings.twin_model, settings.twin_device, dtype=settings.twin_dtype)
        except Exception as exc:  # unknown model/device: an 80 GB device, no weights
            log.warning("simulated GPU gauges: no memory figures, an 80 GB device assumed (%s)", exc)
        else:
            self.weight_bytes = float(p.weight_bytes_per_gpu)
            self.kv_bytes_per_token = float(p.kv_bytes_per_token_per_gpu)
            self.total_bytes = float(p.device_memory_bytes)

    def families(self, util: float, used_bytes: float) -> Iterator[GaugeMetricFamily]:
        """The four DCGM families for a utilisation (0..1) and the framebuffer bytes in use."""
        used_bytes = min(used_bytes, self.total_bytes)
        names, values = list(self.labels), list(self.labels.values())
        for name, doc, value in (
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %). SIMULATED by the engine simulator.", util * 100.0),
            (
                "DCGM_FI_DEV_FB_USED",
                "Framebuffer memory used (in MiB). SIMULATED: weights + KV in use.",
                used_bytes / _MIB,
            ),
            (
                "DCGM_FI_DEV_FB_FREE",
                "Framebuffer memory free (in MiB). SIMULATED.",
                max(0.0, self.total_bytes - used_bytes) / _MIB,
            ),
            (
                "DCGM_FI_DEV_POWER_USAGE",
                "Power draw (in W). SIMULATED: idle + (TDP - idle) x utilisation.",
                self.idle_w + (self.tdp_w - self.idle_w) * util,
            ),
        ):
            fam = GaugeMetricFamily(name, doc, labels=names)
            fam.add_metric(values, value)
            yield fam


class UtilWindow:
    """A utilisation over the time since the previous window, from a cumulative figure (busy
    seconds, or batch-seconds): ``(value - value0) / (now - t0) / scale``, in [0, 1]. Scrapes
    closer than :data:`UTIL_WINDOW_S` to the window's start repeat the last figure."""

    def __init__(self, start: float, first: float = 0.0) -> None:
        self._mark = (start, first)
        self.value = 0.0

    def update(self, now: float, cumulative: float, scale: float = 1.0) -> float:
        t0, c0 = self._mark
        if now - t0 >= UTIL_WINDOW_S:
            self.value = max(0.0, min(1.0, (cumulative - c0) / (now - t0) / scale))
            self._mark = (now, cumulative)
        return self.value


def gpu_block_size(flavor: str) -> int:
    """KV-cache granularity of a flavour's usage figure: vLLM counts whole blocks, SGLang tokens."""
    return KV_BLOCK_SIZE if flavor == "vllm" else 1


class FixedGpuCollector:
    """The DCGM families of the fixed-latency mode: utilisation = mean running batch over the
    window / ``max_num_seqs``; framebuffer = weights + the KV pool's share in use (the pool is what
    ``gpu_memory_utilization`` leaves after the weights, as vLLM sizes it)."""

    def __init__(
        self, scheduler: Callable[[], LoopScheduler], metrics: EngineMetrics, settings: SimSettings, block_size: int
    ) -> None:
        self.scheduler = scheduler
        self.metrics = metrics
        self.settings = settings
        self.block_size = block_size
        self.profile = GpuProfile(settings)
        self._window: UtilWindow | None = None

    def utilisation(self) -> float:
        s = self.scheduler()
        now, tokens = s.clock.now(), s.stats.generation_tokens
        if self._window is None:
            self._window = UtilWindow(now, tokens)
            return 0.0
        # Each running request emits one token per ITL: batch-seconds = tokens x ITL.
        itl_s = self.settings.itl_ms / 1000.0
        return self._window.update(now, tokens * itl_s, float(self.settings.max_num_seqs))

    def used_bytes(self) -> float:
        p = self.profile
        usage = min(1.0, self.metrics.used_tokens(self.block_size) / self.settings.kv_cache_tokens)
        pool = max(0.0, p.total_bytes * p.gpu_memory_utilization - p.weight_bytes)
        return p.weight_bytes + usage * pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return self.profile.families(self.utilisation(), self.used_bytes())
