"""worker-sglang: the base worker lifecycle with the SGLang engine adapter."""
