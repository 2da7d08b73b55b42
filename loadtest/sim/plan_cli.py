"""`tandem plan`'s arguments, apart from the simulator so that `tandem --help` imports nothing heavy."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtest.sim.step_time import ACCELERATORS, MODELS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, required=True, help="cluster YAML (its first tier: pools, SLO, routing)")
    p.add_argument("--accelerator", choices=sorted(ACCELERATORS), default="H200")
    p.add_argument("--model", choices=sorted(MODELS), default="llama-3.1-8b", help="model shape for the step time and KV bytes")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of each engine")
    p.add_argument("--mfu", type=float, default=0.5, help="assumed share of peak FLOP/s reached (roofline)")
    p.add_argument("--mbu", type=float, default=0.7, help="assumed share of peak memory bandwidth reached (roofline)")
    p.add_argument("--bandwidths-gbps", default="10,50,200", help="KV link per engine NIC, Gbit/s (swept)")
    p.add_argument("--transfer-fixed-ms", type=float, default=2.0)
    p.add_argument("--control-cores", type=float, default=4.0, help="cores of the gateway/Serve processes")
    p.add_argument("--rates", default="1,2,4,8")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--prefill-share", type=float, default=0.7)
    p.add_argument("--long", default="2048:64", help="prefill-heavy prompt:output tokens")
    p.add_argument("--short", default="128:512", help="decode-heavy prompt:output tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("plan"), help="folder for plan.json and plan.png")
