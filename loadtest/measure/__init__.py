"""The one measuring home for clients: how a streamed request is read and timed, what is
recorded of it, the percentiles and the SLOs. Used by the Locust load test (loadtest/), the
benchmarks (loadtest/bench/), the soak and the tests.

Reading order: record.py (RequestRecord: what the client saw of one request; Samples) ->
sse.py (StreamReader: SSE lines -> a RequestRecord; stream_async over httpx) ->
percentiles.py (one convention, linear interpolation) -> slo.py (a run's percentile gate,
SLO, from YAML; a request's Objective, for goodput).
"""
