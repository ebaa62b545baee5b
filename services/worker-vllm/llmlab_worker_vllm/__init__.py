"""worker-vllm: the base worker lifecycle with the vLLM engine adapter."""
