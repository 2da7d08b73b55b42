"""The simulated engine mirrors vLLM 0.32's v1 scheduler (loadtest/sim/engine.py) and its
prefix cache hashes blocks with the router's real hasher."""

from __future__ import annotations

import asyncio

from cluster.hashing import BlockHasher
from loadtest.sim.clock import simulate
from loadtest.sim.engine import EngineParams, SimEngine, SimRequest
from loadtest.sim.kv_cache import BlockPool
from loadtest.sim.step_time import CpuFitted
from router.prefix_index import BlockRemoved, BlockStored
from router.prefix_index.memory import MemoryPrefixIndex

BS = 16
STEP = CpuFitted(base_s=0.01, per_seq_s=0.0, per_prompt_token_s=0.001, source="test")
HASHER = BlockHasher(BS)


def _engine(events: list, *, seqs: int = 8, budget: int = 256, blocks: int = 1000) -> SimEngine:
    pool = BlockPool("w", blocks, BS, events.append)
    return SimEngine("w", EngineParams(seqs, budget, BS, blocks), STEP, pool)


def _req(rid: str, prompt: tuple[int, ...], out: int, **kw) -> SimRequest:
    return SimRequest(rid, len(prompt), HASHER.hashes(prompt), out, **kw)


def _prompt(n: int, start: int = 1000) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def test_a_prompt_is_chunked_into_the_token_budget_and_decodes_one_token_a_step():
    async def main():
        e = _engine([], budget=256)
        e.start()
        r = e.submit(_req("a", _prompt(512), 3))
        await r.done.wait()
        return r.tokens

    tokens = simulate(main)
    # Two chunks of 256 (0.01 + 0.256 s each), the first token at the end of the second; then
    # one decode step (0.01 s) per token.
    assert [round(t, 6) for t in tokens] == [0.532, 0.542, 0.552]


def test_running_decodes_come_first_and_a_prompt_takes_the_rest_of_the_budget():
    async def main():
        e = _engine([], budget=64)
        e.start()
        stream = e.submit(_req("s", _prompt(8), 50))
        await stream.first.wait()
        prompt = e.submit(_req("p", _prompt(200, 5000), 1))
        await prompt.done.wait()
        await stream.done.wait()
        return stream, prompt

    stream, prompt = simulate(main)
    assert len(stream.tokens) == 50 and prompt.tokens
    # Every step after the prompt arrived still gave the stream its token: no gap > one step
    # with a 63-token chunk (0.01 + 0.063 s).
    gaps = [b - a for a, b in zip(stream.tokens, stream.tokens[1:])]
    assert max(gaps) <= 0.01 + 0.063 + 1e-9


def test_max_num_seqs_bounds_the_running_requests():
    async def main():
        e = _engine([], seqs=2)
        e.start()
        rs = [e.submit(_req(str(i), _prompt(8, 100 * i), 5)) for i in range(4)]
        await asyncio.sleep(0.001)
        peak = 0
        while not all(r.done.is_set() for r in rs):
            peak = max(peak, len(e.running))
            await asyncio.sleep(0.005)
        return peak, rs

    peak, rs = simulate(main)
    assert peak == 2
    assert rs[2].tokens[0] > rs[0].tokens[-1] - 1e-9  # the third waited for a place


def test_a_repeated_prompt_hits_the_prefix_cache_and_the_index_sees_real_hashes():
    events: list = []
    prompt = _prompt(100)

    async def main():
        e = _engine(events)
        e.start()
        a = e.submit(_req("a", prompt, 1))
        await a.done.wait()
        b = e.submit(_req("b", prompt, 1))
        await b.done.wait()
        return a, b

    a, b = simulate(main)
    assert a.cached_tokens == 0
    assert b.cached_tokens == 96  # 6 full blocks of 16 (the last token is always recomputed)
    stored = [h for ev in events if isinstance(ev, BlockStored) for h in ev.block_hashes]
    assert stored == HASHER.hashes(prompt)  # the 6 full blocks, each once, in order
    index = MemoryPrefixIndex()
    index.apply(events)
    assert index.match(HASHER.hashes(prompt)) == {"w": 6}
    assert b.tokens[0] - 0 < a.tokens[0] * 2  # the hit made b's prefill shorter than a's


def test_blocks_running_out_preempt_the_last_request_and_everyone_still_finishes():
    events: list = []

    async def main():
        e = _engine(events, blocks=12, seqs=8)
        e.start()
        rs = [e.submit(_req(str(i), _prompt(40, 1000 * i), 60)) for i in range(3)]
        for r in rs:
            await r.done.wait()
        return e, rs

    e, rs = simulate(main)
    assert e.preemptions > 0
    assert all(len(r.tokens) == 60 for r in rs)
    assert any(isinstance(ev, BlockRemoved) for ev in events) or e.pool.free_blocks == 12


def test_a_remote_kv_request_pulls_its_uncached_blocks_then_computes_only_its_last_token():
    pulled: list[int] = []

    async def main():
        e = _engine([])
        e.start()

        async def pull(tokens: int) -> None:
            pulled.append(tokens)
            await asyncio.sleep(0.1)

        r = e.submit(_req("d", _prompt(64), 2, remote_kv=pull))
        await r.done.wait()
        return r

    r = simulate(main)
    assert pulled == [64]
    # The pull (0.1 s), then one step computing the last prompt token (0.01 + 0.001 s).
    assert round(r.tokens[0], 6) == 0.111


def test_a_producer_keeps_its_blocks_until_released():
    async def main():
        e = _engine([])
        e.start()
        r = e.submit(_req("p", _prompt(64), 1, hold_blocks=True))
        await r.done.wait()
        held = e.pool.free_blocks
        e.release(r)
        return held, e.pool.free_blocks

    held, after = simulate(main)
    assert after == held + 4


def test_a_pull_without_the_progress_thread_waits_for_the_senders_step_boundary():
    """RESULTS.md section 10: without NIXL's progress thread the prefill engine serves a pull
    only between its steps; an idle engine serves it at once."""
    import asyncio

    from loadtest.sim.clock import simulate
    from loadtest.sim.engine import EngineParams, SimEngine, SimRequest
    from loadtest.sim.kv_cache import BlockPool
    from loadtest.sim.step_time import CpuFitted

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        step = CpuFitted(base_s=0.1, per_seq_s=0.0, per_prompt_token_s=0.0, source="test")
        params = EngineParams(max_num_seqs=4, max_num_batched_tokens=256, block_size=16, num_blocks=64)
        engine = SimEngine("p", params, step, BlockPool("p", 64, 16, lambda ev: None))
        engine.start()
        await engine.next_boundary()
        idle = loop.time()
        engine.submit(SimRequest("r", 16, [], 5))
        await asyncio.sleep(0.25)  # inside its third step (0.2-0.3 s)
        await engine.next_boundary()
        return idle, loop.time()

    idle, busy = simulate(main)
    assert idle == 0.0
    assert abs(busy - 0.3) < 1e-9
