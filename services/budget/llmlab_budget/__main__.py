"""``python -m llmlab_budget``: the budget service (settings from ``LLMLAB_BUDGET_*`` / ``LLMLAB_*``)."""

from __future__ import annotations

from llmlab_common.runtime import run_service

from llmlab_budget.app import create_app
from llmlab_budget.settings import BudgetSettings

if __name__ == "__main__":
    run_service("budget", BudgetSettings, create_app, description="API keys, limits and budgets in Redis.")
