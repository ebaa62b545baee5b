"""``python -m llmlab_accounting``: settings from ``LLMLAB_ACCOUNTING_*`` / ``LLMLAB_*``."""

from __future__ import annotations

from llmlab_common.runtime import serve

from llmlab_accounting.app import create_app
from llmlab_accounting.settings import AccountingSettings


def main() -> None:
    settings = AccountingSettings()
    serve(create_app(settings), settings, "accounting")


if __name__ == "__main__":
    main()
