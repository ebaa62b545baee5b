"""The engine twin: a pure, synchronous model of an LLM engine (no network, no asyncio)."""
