"""Hardware and model catalog of the engine twin: `configs/hardware.yaml` and `configs/models.yaml`.

Both files are validated with pydantic at load; errors name the file and the field. The directory is an
argument or :class:`llmlab_twin.settings.TwinSettings` (``LLMLAB_TWIN_CONFIG_DIR``, default `configs/`).
"""

from __future__ import annotations

import datetime as dt
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llmlab_twin.settings import TwinSettings

# Bytes per element. fp8/int8 are 1 byte; int4 packs two weights a byte (scales ignored).
DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


class CatalogError(ValueError):
    """A catalog file is missing, malformed, or a name is not in it."""


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")
    usd_per_hour: float = Field(ge=0)
    as_of: dt.date
    source: str


class Efficiency(BaseModel):
    """Fitted roofline parameters stored per device (see roofline.EfficiencyParams)."""

    model_config = ConfigDict(extra="forbid")
    compute_eff: float = Field(gt=0, le=1)
    bw_eff: float = Field(gt=0, le=1)
    step_overhead_s: float = Field(ge=0)
    token_overhead_s: float = Field(default=0.0, ge=0)
    seq_overhead_s: float = Field(default=0.0, ge=0)
    source: str = ""


class DeviceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    kind: Literal["gpu", "cpu"]
    vendor: str
    peak_bf16_flops: float = Field(gt=0)
    peak_fp8_flops: float | None = Field(default=None, gt=0)
    peak_fp32_flops: float | None = Field(default=None, gt=0)
    mem_bandwidth_bytes_s: float = Field(gt=0)
    memory_nominal_gb: float = Field(gt=0)
    memory_bytes: int = Field(gt=0)
    interconnect_bytes_s: float | None = Field(default=None, gt=0)
    source: str
    command: str | None = None
    price: Price
    efficiency: Efficiency | None = None

    def peak_flops(self, dtype: str) -> float:
        """Dense peak for the compute dtype. FP8 without FP8 units falls back to bf16 math (weight-only FP8)."""
        if dtype == "fp8" and self.peak_fp8_flops is not None:
            return self.peak_fp8_flops
        if dtype == "fp32" and self.peak_fp32_flops is not None:
            return self.peak_fp32_flops
        return self.peak_bf16_flops


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    hf_id: str
    aliases: tuple[str, ...] = ()
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    num_parameters: int = Field(gt=0)
    source: str

    @model_validator(mode="after")
    def _params_match_config(self) -> ModelSpec:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        computed = self.computed_parameters()
        if computed != self.num_parameters:
            raise ValueError(f"num_parameters {self.num_parameters} != {computed} computed from the config")
        return self

    # Dense decoder-only Llama/Qwen shape: q,k,v,o projections, SwiGLU MLP (3 matrices), 2 RMSNorms a layer.
    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_linear_parameters(self) -> int:
        """Matmul weights of one layer (what FP8/INT4 quantisation shrinks)."""
        h = self.hidden_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        return attn + 3 * h * self.intermediate_size

    def layer_parameters(self) -> int:
        extra = 2 * self.hidden_size
        if self.qkv_bias:
            extra += self.q_dim + 2 * self.kv_dim
        if self.qk_norm:
            extra += 2 * self.head_dim
        return self.layer_linear_parameters() + extra

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def computed_parameters(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_parameters()
        return self.num_layers * self.layer_parameters() + self.embedding_parameters() + lm_head + self.hidden_size

    def matmul_parameters(self) -> int:
        """Weights multiplied per token: every layer plus the LM head (the input embedding is a row lookup)."""
        return self.num_layers * self.layer_linear_parameters() + self.embedding_parameters()

    def weight_bytes(self, dtype: str) -> float:
        """Resident weight bytes. Quantised dtypes shrink layer matmuls only: embeddings, LM head, norms and
        biases stay 16-bit, as in vLLM/ModelOpt FP8 and AWQ/GPTQ checkpoints."""
        b = dtype_bytes(dtype)
        linear = self.num_layers * self.layer_linear_parameters()
        other = self.num_parameters - linear
        return linear * b + other * max(b, 2.0)

    def weight_bytes_read_per_step(self, dtype: str) -> float:
        """Weights streamed from memory in one forward pass: all but the unused rows of an untied input
        embedding (a tied table is read once, as the LM head)."""
        untied_embedding = 0 if self.tie_word_embeddings else self.embedding_parameters()
        return self.weight_bytes(dtype) - untied_embedding * max(dtype_bytes(dtype), 2.0)

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x bytes (MISSION §3)."""
        return 2 * self.num_layers * self.num_key_value_heads * self.head_dim * dtype_bytes(kv_dtype)


def dtype_bytes(dtype: str) -> float:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise CatalogError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


class EngineProfile(BaseModel):
    """What an engine adds on any GPU, on top of the device's fitted efficiencies (calibrate gpu, split
    ``fit_engine``). Not applied to CPU devices: their fit already is a real engine's."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    step_overhead_s: float = Field(ge=0)
    source: str = ""


class _HardwareFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1]
    devices: list[DeviceSpec]
    engines: dict[str, EngineProfile] = Field(default_factory=dict)


class _ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1]
    models: list[ModelSpec]


def config_dir(path: str | Path | None = None) -> Path:
    """``path`` when given, else the settings' ``config_dir`` (``LLMLAB_TWIN_CONFIG_DIR``)."""
    return Path(path) if path is not None else TwinSettings().config_dir


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from exc


def _describe(exc: ValidationError, data: Any, list_key: str) -> str:
    lines = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ".".join(str(p) for p in loc)
        # Name the entry ("devices[3] (H200)") so the error is findable without counting list items.
        if len(loc) >= 2 and loc[0] == list_key and isinstance(loc[1], int):
            try:
                name = data[list_key][loc[1]].get("name", "?")
                where = f"{list_key}[{loc[1]}] ({name})" + "".join(f".{p}" for p in loc[2:])
            except (KeyError, IndexError, TypeError, AttributeError):
                pass
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def _check_unique(names: list[str], path: Path) -> None:
    seen: set[str] = set()
    for n in names:
        if n.lower() in seen:
            raise CatalogError(f"{path}: duplicate name {n!r}")
        seen.add(n.lower())


@lru_cache(maxsize=8)
def _load_hardware_file(path: Path) -> _HardwareFile:
    data = _read_yaml(path)
    try:
        parsed = _HardwareFile.model_validate(data)
    except ValidationError as exc:
        raise CatalogError(f"{path}: invalid hardware catalog:\n{_describe(exc, data, 'devices')}") from exc
    _check_unique([d.name for d in parsed.devices], path)
    return parsed


def _load_hardware(path: Path) -> dict[str, DeviceSpec]:
    return {d.name: d for d in _load_hardware_file(path).devices}


def get_engine_profile(engine: str, path: str | Path | None = None) -> EngineProfile | None:
    """The calibrated profile of an engine ("vllm", "sglang"), None when it has none."""
    parsed = _load_hardware_file(Path(path) if path else config_dir() / "hardware.yaml")
    return parsed.engines.get(engine.lower())


@lru_cache(maxsize=8)
def _load_models(path: Path) -> dict[str, ModelSpec]:
    data = _read_yaml(path)
    try:
        parsed = _ModelsFile.model_validate(data)
    except ValidationError as exc:
        raise CatalogError(f"{path}: invalid model catalog:\n{_describe(exc, data, 'models')}") from exc
    _check_unique([n for m in parsed.models for n in (m.name, m.hf_id, *m.aliases)], path)
    return {m.name: m for m in parsed.models}


def load_hardware(path: str | Path | None = None) -> dict[str, DeviceSpec]:
    """Devices by name from hardware.yaml (`path` is the file, or None for <config_dir>/hardware.yaml)."""
    return dict(_load_hardware(Path(path) if path else config_dir() / "hardware.yaml"))


def load_models(path: str | Path | None = None) -> dict[str, ModelSpec]:
    """Models by name from models.yaml (`path` is the file, or None for <config_dir>/models.yaml)."""
    return dict(_load_models(Path(path) if path else config_dir() / "models.yaml"))


def get_device(name: str, path: str | Path | None = None) -> DeviceSpec:
    devices = load_hardware(path)
    for dev in devices.values():
        if dev.name.lower() == name.lower():
            return dev
    raise CatalogError(f"unknown device {name!r}; known: {', '.join(devices)}")


def get_model(name: str, path: str | Path | None = None) -> ModelSpec:
    """By name, alias or Hugging Face id, case-insensitive."""
    models = load_models(path)
    key = name.lower()
    for m in models.values():
        if key in {m.name.lower(), m.hf_id.lower(), *(a.lower() for a in m.aliases)}:
            return m
    raise CatalogError(f"unknown model {name!r}; known: {', '.join(models)}")
