"""worker-openai: the worker lifecycle in front of any OpenAI-compatible local server."""
