pytest_plugins = ["llmlab_testkit.fixtures"]
