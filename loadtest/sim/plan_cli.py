"""`tandem plan`'s arguments, apart from the simulator so that `tandem --help` imports nothing heavy."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtest.sim.step_time import ACCELERATORS, MODELS

STEP_TIMES = ("auto", "table", "roofline")  # plan_step.CHOICES, repeated so --help stays light

# The mix-only flags default to None in argparse so that one given beside a trace can be told
# from one left alone (plan_inputs.workload refuses it); these are their values for the mix.
MIX_LONG = "2048:64"
MIX_SHORT = "128:512"
MIX_PREFILL_SHARE = 0.7
MIX_MAX_REQUESTS = 40_000
# The capacity search's flags (with --gpus only; None: not given, refused without --gpus).
SEARCH_STEPS = 3
ATTAINMENT = 0.9
SEEDS = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, required=True, help="cluster YAML (its first tier: pools, SLO, routing)")
    p.add_argument("--slo", help="the tier's objectives instead of the config's, seconds: ttft=1.5,itl=0.04[,max_gap=0.08] "
                                 "(the decider's budgets and the goodput judgement read them)")
    p.add_argument("--gpus", help="a GPU budget, COUNTxGPU (e.g. 16xH200): sweep COUNT/TP colocated engines and the "
                                  "P:D splits of COUNT GPUs, search each one's capacity under the SLO, and recommend the "
                                  "highest")
    p.add_argument("--accelerator", choices=sorted(ACCELERATORS), help="the GPU (default H200; with --gpus, its GPU)")
    p.add_argument("--model", choices=sorted(MODELS), default="llama-3.1-8b", help="model shape for the step time and KV bytes")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of each engine (GPUs per engine); with "
                                                     "--gpus, the colocated engines' and the default of the two below")
    p.add_argument("--prefill-tp", type=int, help="with --gpus: GPUs per prefill engine (default --tp); its own step "
                                                  "time and KV cache")
    p.add_argument("--decode-tp", type=int, help="with --gpus: GPUs per decode engine (default --tp). A split of P "
                                                 "prefill and D decode engines takes P x --prefill-tp + D x --decode-tp "
                                                 "GPUs; the splits swept are those no further engine fits beside")
    p.add_argument("--step-time", choices=STEP_TIMES, default="auto",
                   help="auto: AIConfigurator's tables where they hold GPU x model x TP, else the roofline bound")
    p.add_argument("--gemm", choices=("fp8", "bfloat16"), default="fp8", help="GEMM precision of the tables")
    p.add_argument("--mfu", type=float, default=0.5, help="assumed share of peak FLOP/s reached (roofline)")
    p.add_argument("--mbu", type=float, default=0.7, help="assumed share of peak memory bandwidth reached (roofline)")
    p.add_argument("--bandwidths-gbps", default="10,50,200", help="KV link per engine NIC, Gbit/s (swept)")
    p.add_argument("--transfer-fixed-ms", type=float, default=2.0)
    p.add_argument("--control-cores", type=float, default=4.0,
                   help="cores of the gateway/Serve processes: the output says the cores each run's control plane "
                        "needed (busiest second, mean) and where that passes these (counted, not a limit: the "
                        "simulated engines are not slowed by it)")
    p.add_argument("--workload", default="mix",
                   help="mix (the default): the seeded Poisson mix of --long/--short/--prefill-share, as the goodput "
                        "benchmark offers it; else a trace file, JSON Lines, one request a line in arrival order: "
                        '{"arrival_s": 0.1, "prompt_tokens": 2048, "output_tokens": 64} plus, both or neither, '
                        '"prefix_group": "chat", "prefix_tokens": 512 (a prefix shared by the group\'s requests). '
                        "With a trace, the trace is the load: --rates are replay speeds, --duration does not apply "
                        "(format: loadtest/sim/workload_trace.py)")
    p.add_argument("--rates", help="offered loads, req/s of the mix (default 1,2,4,8; with --gpus: the capacity search's "
                                   "ladder, default auto: 0.4,0.7,1,1.3 x an estimated capacity of the GPUs); with a "
                                   "trace, replay speeds of its own rate (default 1: as written; 0.5,1,2: every arrival "
                                   "at twice, once, half its time)")
    p.add_argument("--search-steps", type=int,
                   help="with --gpus: bisections after the ladder, per candidate and KV link. Each candidate's capacity "
                        "(the highest offered load meeting --attainment) takes at most len(ladder) + this many loads "
                        "(each run --seeds times) and is found within the widest ladder gap (0 to its first load included) / 2**this "
                        f"(default {SEARCH_STEPS})")
    p.add_argument("--attainment", type=float,
                   help="with --gpus: the share of a load's requests within the SLO (TTFT + mean ITL) for that load to "
                        f"count as served (default {ATTAINMENT:g})")
    p.add_argument("--seeds", type=int,
                   help="with --gpus: run each load with this many seeds, --seed, --seed+1, ... (the mix's Poisson "
                        "arrivals, a trace's token ids, the simulation's own draws). A load meets the SLO when at least "
                        "--attainment of all its seeds' requests, pooled, do; its goodput is those met over the seeds' "
                        "windows (the seeds' mean). The JSON gives each seed's figures and capacity and their spread; a "
                        "winner's margin within the seeds' spread is called noise (with one seed, under a fixed 5%% of "
                        f"its capacity: nothing measured). Runs: (ladder + bisections) x this (default {SEEDS})")
    p.add_argument("--modes", default="adaptive,always", help="with --gpus: tandem's disaggregation modes run on "
                                                              "every P:D split (colocated is always run)")
    p.add_argument("--max-splits", type=int, default=7, help="with --gpus: at most this many P:D splits, evenly spaced")
    p.add_argument("--duration", type=float, help="seconds of offered load of the mix (default 30; with --gpus 10, "
                                                  "shortened to --max-requests)")
    p.add_argument("--max-requests", type=int,
                   help=f"with --gpus, the mix and no --duration: shorten the load so the sweep simulates at most this "
                        f"many requests (default {MIX_MAX_REQUESTS:,}; ~360 per CPU-second on a 2-core VM, drains "
                        "included), not below max(4 s, 4 TTFT objectives); not with a trace")
    p.add_argument("--prefill-share", type=float,
                   help=f"the mix's share of prefill-heavy requests (default {MIX_PREFILL_SHARE:g}; not with a trace)")
    p.add_argument("--long", help=f"the mix's prefill-heavy prompt:output tokens (default {MIX_LONG}; not with a trace)")
    p.add_argument("--short", help=f"the mix's decode-heavy prompt:output tokens (default {MIX_SHORT}; not with a trace)")
    p.add_argument("--seed", type=int, default=0, help="the traces' seed (with --gpus --seeds N: the first of N)")
    p.add_argument("--out", type=Path, default=Path("plan"), help="folder for plan.json and plan.png")
