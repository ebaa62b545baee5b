"""Shared library of llm-inference-lab: contracts (NATS names, messages, errors, catalog) and runtime."""

SCHEMA_VERSION = 1
