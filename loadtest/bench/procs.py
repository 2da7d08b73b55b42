"""Who spends the CPU: the processes of one system (tandem or a direct vLLM server), each
sorted into a kind by its title, and their CPU seconds between two snapshots.

Ray sets worker process titles ("ray::ServeReplica:tandem:Gateway", "ray::ProxyActor", ...)
and vLLM its own ("VLLM::EngineCore", "VLLM::Worker"), so the command line says what a
process is. An engine's EngineCore and Worker are children of the process that started them
(a Serve replica, or vLLM's api_server), which gives them a role such as "interactive-decode".
Classification and the arithmetic are pure functions over plain records (unit-tested); only
`snapshot` reads /proc (through psutil).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional

import psutil

GATEWAY = "gateway"
ENGINE_REPLICA = "engine replica"  # a Serve replica holding an AsyncLLM (tandem's engine front)
API_SERVER = "vLLM API server"  # the direct server's front process
PROXY = "Serve proxy"
CONTROLLER = "Serve controller"
RAY_CORE = "raylet+GCS"
ENGINE_CORE = "vLLM engine core"
WORKER = "vLLM worker"
DRIVER = "tandem driver"  # `tandem run`: the Ray driver that started the cluster
OTHER = "other"
KINDS = (GATEWAY, PROXY, CONTROLLER, RAY_CORE, ENGINE_REPLICA, API_SERVER, ENGINE_CORE, WORKER, DRIVER, OTHER)

_REPLICA = "ray::ServeReplica:"


@dataclass(frozen=True)
class ProcRecord:
    pid: int
    ppid: int
    cmdline: str
    create_time: float
    cpu_s: float  # user + system, this process only


def classify(cmdline: str) -> str:
    """The kind of a process from its command line (as psutil or /proc shows it)."""
    head = cmdline.strip()
    if head.startswith(_REPLICA):
        return GATEWAY if _deployment(head) == "Gateway" else ENGINE_REPLICA
    if head.startswith("ray::ProxyActor") or head.startswith("ray::HTTPProxyActor"):
        return PROXY
    if head.startswith("ray::ServeController"):
        return CONTROLLER
    if head.startswith("VLLM::EngineCore"):
        return ENGINE_CORE
    if head.startswith("VLLM::Worker"):
        return WORKER
    if head.startswith("VLLM::APIServer") or "vllm.entrypoints.openai.api_server" in head:
        return API_SERVER
    exe = head.split()[0].rsplit("/", 1)[-1] if head else ""
    if exe in ("raylet", "gcs_server"):
        return RAY_CORE
    if "cluster.cli run" in head or (exe == "tandem" and " run" in head):
        return DRIVER
    return OTHER


def _deployment(head: str) -> str:
    """"Gateway" from "ray::ServeReplica:tandem:Gateway" and from the title Ray shows while
    a method runs, "ray::ServeReplica:tandem:Gateway.handle_request"."""
    name = head[len(_REPLICA):].split()[0] if len(head) > len(_REPLICA) else ""
    return name.split(":", 1)[-1].split(".", 1)[0]


def replica_role(cmdline: str) -> Optional[str]:
    """"interactive-decode" for "ray::ServeReplica:tandem:interactive-decode ..."; else None."""
    head = cmdline.strip()
    if not head.startswith(_REPLICA):
        return None
    name = _deployment(head)
    return None if name in ("Gateway", "") else name


def role_of(pid: int, table: Mapping[int, ProcRecord]) -> Optional[str]:
    """The pool an engine process serves: the role of its nearest engine-replica ancestor
    (itself included). None outside any pool (the gateway, Ray, a direct server)."""
    seen = set()
    while pid in table and pid not in seen:
        seen.add(pid)
        role = replica_role(table[pid].cmdline)
        if role:
            return role
        pid = table[pid].ppid
    return None


def descendants(root: int, table: Mapping[int, ProcRecord]) -> set[int]:
    """`root` and every process below it in `table` (by parent pid)."""
    children = defaultdict(list)
    for rec in table.values():
        children[rec.ppid].append(rec.pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in out or pid not in table:
            continue
        out.add(pid)
        todo.extend(children[pid])
    return out


def label(pid: int, table: Mapping[int, ProcRecord]) -> tuple[str, Optional[str]]:
    return classify(table[pid].cmdline), role_of(pid, table)


def cpu_delta(before: Mapping[int, ProcRecord], after: Mapping[int, ProcRecord],
              pids: Iterable[int]) -> dict[tuple[str, Optional[str]], float]:
    """CPU seconds spent between two snapshots by (kind, role), over `pids` of `after`.
    A process born in between counts from zero; one whose pid was reused (another create
    time) counts as new; one that exited in between is lost (its last seconds are unknown)."""
    out: dict[tuple[str, Optional[str]], float] = defaultdict(float)
    for pid in pids:
        now = after.get(pid)
        if now is None:
            continue
        was = before.get(pid)
        base = was.cpu_s if was is not None and was.create_time == now.create_time else 0.0
        out[label(pid, after)] += max(0.0, now.cpu_s - base)
    return dict(out)


def by_kind(delta: Mapping[tuple[str, Optional[str]], float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (kind, _role), seconds in delta.items():
        out[kind] += seconds
    return dict(out)


def by_process(delta: Mapping[tuple[str, Optional[str]], float]) -> dict[str, float]:
    """"vLLM worker [interactive-decode]": seconds; kinds without a role keep their name."""
    return {(f"{kind} [{role}]" if role else kind): seconds for (kind, role), seconds in delta.items()}


def snapshot() -> dict[int, ProcRecord]:
    """Every process this user can read, with its CPU seconds so far."""
    out = {}
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "name", "create_time", "cpu_times"]):
        info = proc.info
        times = info.get("cpu_times")
        if times is None or info.get("create_time") is None:
            continue
        cmd = " ".join(info.get("cmdline") or []) or (info.get("name") or "")
        out[info["pid"]] = ProcRecord(info["pid"], info["ppid"] or 0, cmd, info["create_time"],
                                      times.user + times.system)
    return out


def machine_busy_s(before, after) -> tuple[float, float]:
    """(CPU seconds the whole machine was busy, seconds stolen by the hypervisor) between two
    psutil.cpu_times() readings; exited processes included, which per-process sums miss."""
    def busy(t) -> float:
        return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)

    return max(0.0, busy(after) - busy(before)), max(0.0, getattr(after, "steal", 0.0) - getattr(before, "steal", 0.0))


class Reaper:
    """Remembers every process seen in a system's tree (pid + create time); at exit kills any
    still alive, so a crashed or interrupted run leaves neither Ray nor an engine behind."""

    def __init__(self):
        self.seen: dict[int, float] = {}

    def note(self, table: dict[int, ProcRecord], pids: set[int]) -> None:
        for pid in pids:
            self.seen[pid] = table[pid].create_time

    def reap(self, progress: Callable[[str], None], sweep_children: bool = True) -> None:
        """Kill what is left; `sweep_children`: also every descendant of this process (a
        benchmark's own; never inside a test process, whose children are fixtures')."""
        left = []
        for pid, born in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == born and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(proc)
            except psutil.NoSuchProcess:
                pass
        if sweep_children:
            left += [p for p in psutil.Process().children(recursive=True) if p not in left]
        killed = []
        for proc in left:
            try:
                kind = classify(" ".join(proc.cmdline()))
                proc.kill()
                killed.append(kind)
            except psutil.NoSuchProcess:
                pass
        if killed:
            progress(f"[stream] killed {len(killed)} leftover process(es): {', '.join(sorted(killed))}")
