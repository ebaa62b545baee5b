"""Where the twin finds its catalogs: ``hardware.yaml`` and ``models.yaml`` in ``config_dir``
(``LLMLAB_TWIN_CONFIG_DIR``; default ``configs/`` under the working directory, which is the
repository root for every command of this repository). Functions that read a catalog also take
an explicit path, which wins."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class TwinSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMLAB_TWIN_", extra="ignore")

    config_dir: Path = Path("configs")
