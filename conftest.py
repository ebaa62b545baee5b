import os

pytest_plugins = ["llmlab_testkit.fixtures", "llmlab_testkit.vllm", "pytester"]

# Processes without LLMLAB_ENV are prod (dev keys refused); tests run as the test environment,
# and every service they start inherits it. A test of the prod rules sets or unsets it itself.
os.environ.setdefault("LLMLAB_ENV", "test")
