"""The benchmarks (not tests, never in CI; those that start clusters run under the cluster
lock), each `python -m loadtest.bench.NAME --help`: goodput (disaggregated vs colocated),
ttft_vs_direct (cluster overhead), stream (stream smoothness and CPU per token vs a direct
engine), routing (routing policies on a multi-tenant trace), router_micro (the router
in-process). Results of record: RESULTS.md and results/. They measure with loadtest/measure/.
"""
