"""The standalone NIXL block-transfer benchmark (kv_transfer/bench): a real NIXL READ between two
processes moves the bytes intact, and the benchmark writes its JSON and plot. No Ray, no vLLM."""

from __future__ import annotations

import json


from kv_transfer.bench.__main__ import main
from kv_transfer.bench.nixl_transfer import MIB, nixl_reads


def test_nixl_read_moves_the_source_bytes():
    [result] = nixl_reads([4 * MIB], block_bytes=MIB, repeats=1, digests=True)

    assert result.descriptors == 4
    assert result.verified  # initiator: destination equals the rebuilt source pattern
    # and byte for byte what the target process holds, hashed on each side
    assert result.src_sha256 is not None
    assert result.dst_sha256 == result.src_sha256
    assert result.gib_s > 0


def test_benchmark_writes_json_and_plot(tmp_path):
    out = tmp_path / "nixl.json"
    main(["--sizes-mib", "1", "4", "--block-mib", "1", "--repeats", "1", "--out", str(out)])

    report = json.loads(out.read_text())
    assert {"command", "machine", "device", "results", "target", "all_verified"} <= report.keys()
    assert report["all_verified"] is True
    assert [r["size_mib"] for r in report["results"]] == [1, 4]
    row = report["results"][0]
    assert {"size_bytes", "block_bytes", "nixl_gib_s", "memcpy_gib_s", "memcpy_gib_s_1_thread",
            "memcpy_gib_s_default_threads", "ratio", "verified"} <= row.keys()
    assert isinstance(report["target"]["met"], bool)
    assert out.with_suffix(".png").stat().st_size > 0
