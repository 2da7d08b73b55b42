"""kv_transfer/bench on a machine that may lack matplotlib (the device machines' image), for
tests/gpu/device_nixl_bench.sh:

    python tests/gpu/nixl_vram_bench.py DEVICE OUT.json [bench arguments...]

Exit 0 when every transfer was verified. A file, not stdin: the bench spawns processes, and
spawn re-imports the main module from its path.
"""

from __future__ import annotations

import importlib.util
import json
import sys


def main(argv: list[str]) -> int:
    import kv_transfer.bench.__main__ as bench

    if importlib.util.find_spec("matplotlib") is None:
        print("[device] matplotlib is missing: JSON only (plot it elsewhere with kv_transfer.bench.__main__.plot)")
        bench.plot = lambda report, path: None
    device, out, *rest = argv
    report = bench.main(["--device", device, "--out", out, *rest])
    for row in report["results"]:
        print(f"[device] {row['src_device']}->{row['dst_device']} {row['size_mib']:>5} MiB, blocks "
              f"{row['block_mib']} MiB: NIXL {row['nixl_gib_s']:8.2f} GiB/s, memcpy {row['memcpy_gib_s']:8.2f} GiB/s, "
              f"ratio {row['ratio']:.2f}")
    print("[device] ucx_env", json.dumps(report["ucx_env"]))
    return 0 if report["all_verified"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
