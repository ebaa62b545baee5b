"""OpenAI-compatible engine simulator of llm-inference-lab: presents itself as vLLM or SGLang."""
