"""The tutorial's experiments, one module each, run by ``python -m llmlab_experiments``."""
