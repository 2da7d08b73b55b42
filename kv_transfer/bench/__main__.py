"""`python -m kv_transfer.bench`: NIXL READ bandwidth against memcpy, per transfer size and block
size, written as JSON plus a PNG plot. Needs only torch, NIXL and matplotlib.

    python -m kv_transfer.bench                       # CPU: host -> host over UCX (loopback)
    python -m kv_transfer.bench --device cuda         # GPU: device -> device and device -> host

The memcpy reference is `dst.copy_(src)` in this process on buffers of the same kind, once with
one torch thread and once with torch's default; the ratio is taken against the faster of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

from kv_transfer.bench.nixl_transfer import MIB, TransferResult, nixl_reads, ucx_env

DEFAULT_SIZES_MIB = [1, 4, 16, 64, 256, 1024]
DEFAULT_BLOCKS_MIB = [1, 4]
TARGET_RATIO = 0.5  # issue 10: NIXL at least 50% of memcpy for blocks of 1 MiB and more


def _modes(device: str) -> list[tuple[str, str]]:
    """(source, destination) memory of each series: the KV moves from the prefill's buffer."""
    if device == "cpu":
        return [("cpu", "cpu")]
    return [(device, device), (device, "cpu")]


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def memcpy_gib_s(size: int, src_device: str, dst_device: str, repeats: int, threads: int | None) -> float:
    """Median bandwidth of `dst.copy_(src)` for `size` bytes; threads=None keeps torch's default."""
    import torch

    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads or default_threads)
    try:
        src = torch.randint(0, 256, (size,), dtype=torch.uint8).to(src_device)
        dst = torch.empty(size, dtype=torch.uint8, device=dst_device)
        seconds = []
        for rep in range(repeats + 1):  # first copy is a warm-up (page faults on dst)
            _sync()
            t0 = time.perf_counter()
            dst.copy_(src)
            _sync()
            if rep:
                seconds.append(time.perf_counter() - t0)
        return size / statistics.median(seconds) / (1 << 30)
    finally:
        torch.set_num_threads(default_threads)


def machine() -> dict:
    import torch

    cpu = platform.processor()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    try:
        from importlib.metadata import version

        nixl_version = version("nixl")
    except Exception:
        nixl_version = None
    return {
        "hostname": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1), "torch": torch.__version__, "nixl": nixl_version,
        "torch_default_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def run(args: argparse.Namespace) -> dict:
    rows = []
    for src_dev, dst_dev in _modes(args.device):
        for block_mib in args.block_mib:
            sizes = [s * MIB for s in args.sizes_mib if s >= block_mib and s % block_mib == 0]
            print(f"[nixl] {src_dev}->{dst_dev} block {block_mib} MiB: sizes {[s // MIB for s in sizes]} MiB",
                  flush=True)
            t0 = time.perf_counter()
            results: list[TransferResult] = nixl_reads(sizes, block_mib * MIB, args.repeats, src_dev, dst_dev)
            for r in results:
                print(f"[nixl]   {r.size_bytes // MIB:>5} MiB in {r.descriptors:>4} blocks: "
                      f"{r.gib_s:6.2f} GiB/s verified={r.verified}", flush=True)
            print(f"[nixl]   ({time.perf_counter() - t0:.1f} s incl. process start)", flush=True)
            rows += [dict(r.__dict__, block_mib=block_mib) for r in results]
    memcpy: dict[tuple[str, str, int], dict] = {}
    for row in rows:
        key = (row["src_device"], row["dst_device"], row["size_bytes"])
        if key not in memcpy:
            one = memcpy_gib_s(key[2], key[0], key[1], args.repeats, threads=1)
            default = memcpy_gib_s(key[2], key[0], key[1], args.repeats, threads=None)
            memcpy[key] = {"memcpy_gib_s_1_thread": one, "memcpy_gib_s_default_threads": default}
            print(f"[memcpy] {key[0]}->{key[1]} {key[2] // MIB:>5} MiB: {one:6.2f} GiB/s (1 thread), "
                  f"{default:6.2f} GiB/s (default threads)", flush=True)
        row.update(memcpy[key])
        row["memcpy_gib_s"] = max(memcpy[key].values())
        row["ratio"] = row["gib_s"] / row["memcpy_gib_s"]
        row["ratio_1_thread"] = row["gib_s"] / row["memcpy_gib_s_1_thread"]
        row["size_mib"] = row["size_bytes"] // MIB
        row["nixl_gib_s"] = row.pop("gib_s")
    judged = [r for r in rows if r["block_bytes"] >= MIB]
    worst = min(judged, key=lambda r: r["ratio"]) if judged else None
    return {
        "benchmark": "nixl_block_read_vs_memcpy",
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, "-m", "kv_transfer.bench", *args.argv]),
        "machine": machine(),
        "device": args.device,
        "ran_on_gpu": args.device != "cpu",
        "ucx_env": {f"{s}->{d}": ucx_env(s, d) for s, d in _modes(args.device)},
        "repeats": args.repeats,
        "sizes_mib": args.sizes_mib,
        "block_sizes_mib": args.block_mib,
        "results": rows,
        "target": {
            "rule": f"NIXL >= {TARGET_RATIO:.0%} of memcpy bandwidth (faster of 1 thread / default threads) "
                    "for every size with blocks of 1 MiB and more",
            "met": bool(judged) and all(r["ratio"] >= TARGET_RATIO for r in judged),
            "worst_ratio": worst["ratio"] if worst else None,
            "worst_case": {k: worst[k] for k in ("src_device", "dst_device", "size_mib", "block_mib")} if worst else None,
        },
        "all_verified": all(r["verified"] for r in rows),
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(8, 5))
    rows = report["results"]
    for mode in dict.fromkeys((r["src_device"], r["dst_device"]) for r in rows):
        label = f"{mode[0]}->{mode[1]}"
        mine = [r for r in rows if (r["src_device"], r["dst_device"]) == mode]
        for block in dict.fromkeys(r["block_mib"] for r in mine):
            pts = [r for r in mine if r["block_mib"] == block]
            ax.plot([r["size_mib"] for r in pts], [r["nixl_gib_s"] for r in pts], "o-",
                    label=f"NIXL READ {label}, {block} MiB blocks")
        ref = {r["size_mib"]: r for r in mine}
        xs = sorted(ref)
        for key, style, name in (("memcpy_gib_s_1_thread", "s--", "1 thread"),
                                 ("memcpy_gib_s_default_threads", "^--", "default threads")):
            ax.plot(xs, [ref[x][key] for x in xs], style, label=f"memcpy {label}, {name}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_xlabel("transfer size (MiB)")
    ax.set_ylabel("GiB/s (median)")
    m = report["machine"]
    where = m["gpu"] or f"{m['cores']} cores, {m['cpu']}"
    ax.set_title(f"NIXL block READ vs memcpy ({where})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m kv_transfer.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu",
                        help="cpu, or cuda / cuda:N for GPU memory (device->device and device->host)")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=DEFAULT_SIZES_MIB)
    parser.add_argument("--block-mib", type=int, nargs="+", default=DEFAULT_BLOCKS_MIB,
                        help="descriptor (KV block) sizes; each transfer is split into these")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per size (median kept)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/nixl_transfer.json"))
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in the JSON
    if args.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device {args.device}: torch sees no CUDA device; use --device cpu here")
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    png = args.out.with_suffix(".png")
    plot(report, png)
    t = report["target"]
    print(f"[done] {args.out} and {png}; target {'met' if t['met'] else 'MISSED'} "
          f"(worst ratio {t['worst_ratio']:.2f} at {t['worst_case']}); all verified: {report['all_verified']}",
          flush=True)
    return report


if __name__ == "__main__":
    main()
