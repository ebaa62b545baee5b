"""Router service: the route responder over NATS and the explain/check command line.

The decision core is the library llmlab_routing."""
