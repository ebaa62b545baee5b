"""Accounting: cost events in ClickHouse, GPU-time attribution, reports and the cost model."""
