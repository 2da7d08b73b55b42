"""`tandem run`'s log file on a real Ray driver (cluster/console.py RunLog): Ray's forwarded
worker output lands in the file with Ray's prefix instead of on the console, and an ERROR record
from a worker reaches the console too. Ray's hook is private, so this is where a Ray upgrade
that changes it shows."""

from __future__ import annotations

import time


def test_forwarded_worker_output_goes_to_the_run_log_and_errors_also_to_the_console(serve_session, tmp_path):
    import ray
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from cluster.console import RunLog

    @ray.remote(num_cpus=0)
    def speak() -> None:
        import sys

        print("a routine line from a worker", flush=True)
        print("ERROR 2026-12-05 10:00:00,000 test -- something a person must see", file=sys.stderr, flush=True)

    path = tmp_path / "run.log"
    echoed: list[str] = []
    before = list(dispatcher.handlers)
    log = RunLog(path, console=echoed.append)
    log.attach_to_ray()
    try:
        ray.get(speak.remote(), timeout=60)
        deadline = time.monotonic() + 30  # forwarding is asynchronous (the GCS, then Ray's log thread)
        while not (echoed and "a routine line" in path.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        log.close()
        dispatcher.handlers = before  # Ray prints worker output again for the rest of the session
    lines = path.read_text().splitlines()
    assert any(line.startswith("(speak pid=") and line.endswith("a routine line from a worker") for line in lines)
    assert len(echoed) == 1 and echoed[0].startswith("[tandem] (speak pid=")
    assert echoed[0].endswith("-- something a person must see")
