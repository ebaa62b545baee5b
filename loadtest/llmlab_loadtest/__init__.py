"""Load tools: the SSE load client, the benchmark metadata block and the benchmarks (`make bench`)."""
