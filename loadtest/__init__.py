"""Locust load tests for tandem's OpenAI API: streaming TTFT/ITL measurement, seeded
workloads built from the model's tokenizer, an SLO gate and a report (see README.md).

    python -m loadtest --host http://127.0.0.1:8000 --slo loadtest/slo/cpu-tiny.yaml
    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --slo loadtest/slo/cpu-tiny.yaml
"""
