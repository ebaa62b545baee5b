"""``python -m llmlab_accounting``: the accounting service (settings from ``LLMLAB_ACCOUNTING_*`` / ``LLMLAB_*``)."""

from __future__ import annotations

from llmlab_common.runtime import run_service

from llmlab_accounting.app import create_app
from llmlab_accounting.settings import AccountingSettings

if __name__ == "__main__":
    run_service(
        "accounting", AccountingSettings, create_app, description="Cost events in ClickHouse, GPU-time attribution."
    )
