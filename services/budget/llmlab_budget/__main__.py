"""``python -m llmlab_budget``: settings from ``LLMLAB_BUDGET_*`` / ``LLMLAB_*``."""

from __future__ import annotations

from llmlab_common.runtime import serve

from llmlab_budget.app import create_app
from llmlab_budget.settings import BudgetSettings


def main() -> None:
    settings = BudgetSettings()
    serve(create_app(settings), settings, "budget")


if __name__ == "__main__":
    main()
