pytest_plugins = ["llmlab_testkit.fixtures", "llmlab_testkit.vllm", "pytester"]
