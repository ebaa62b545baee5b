"""Accounting: cost events in ClickHouse, GPU-time attribution and reports."""
