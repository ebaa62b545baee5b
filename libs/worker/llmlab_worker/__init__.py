"""Base worker lifecycle shared by worker-vllm and worker-sglang."""
