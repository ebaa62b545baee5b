"""Budget metrics: no user, key or request ids as labels (those go to logs and ClickHouse)."""

from __future__ import annotations

from llmlab_common.metrics import Metrics

RATIO_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.5, 2.0, 5.0)
FAST_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class BudgetMetrics:
    def __init__(self, m: Metrics) -> None:
        self.reservations = m.counter("budget_reservations_total", "Reservations granted")
        self.refusals = m.counter("budget_refusals_total", "Requests refused by reason", ("reason",))
        self.reserved_tokens = m.counter("budget_reserved_tokens_total", "Tokens reserved (input + output allowance)")
        self.charged_tokens = m.counter("budget_charged_tokens_total", "Tokens charged at settlement")
        self.settlements = m.counter(
            "budget_settlements_total",
            "Settlement events by result (settled, released, late = settled after its release, dup = already "
            "closed, resettled = a later attempt's charge replaced an earlier one's, missing = no reservation)",
            ("result",),
        )
        self.settle_lag = m.histogram("budget_settlement_lag_seconds", "Request end (event time) to settled in Redis")
        self.reserve_seconds = m.histogram(
            "budget_reserve_duration_seconds", "Reserve handling time in the budget service", buckets=FAST_BUCKETS
        )
        self.reserved_vs_actual = m.histogram(
            "budget_charged_to_reserved_ratio",
            "Charged / reserved tokens per settled request (1 = exact; above 1 = under-reserved)",
            buckets=RATIO_BUCKETS,
        )
        self.underreserved_tokens = m.counter(
            "budget_underreserved_tokens_total", "Tokens charged beyond the reservation (prompt under-estimated)"
        )
        self.pending_reserves = m.gauge(
            "budget_pending_reserves", "Reserves taken and not yet answered (over max_pending_reserves: shed, 429)"
        )
        self.reaped = m.counter("budget_reaped_reservations_total", "Reservations released by the reaper")
        self.settle_errors = m.counter("budget_settle_errors_total", "Events that failed to settle (retried)")
        self.settle_dead_letters = m.counter(
            "budget_settle_dead_letters_total",
            "Events that failed to settle on every delivery, dead-lettered (their charge is not applied)",
        )
        self.unknown_key_cache_hits = m.counter(
            "budget_unknown_key_cache_hits_total", "Unknown API keys answered from memory (no Redis round trip)"
        )
