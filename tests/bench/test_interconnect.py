"""Interconnect ceilings: the topology parser, nccl-tests' bus bandwidth, and the all-reduce sweep on two CPU ranks
(gloo, started by torch.distributed's launcher, the path `fuselab device` takes on a multi-GPU host)."""

from __future__ import annotations

import pytest

from fuselab.bench.interconnect import KiB, all_reduce_ranks, bus_bandwidth, message_sizes, parse_topology

TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tSYS\tPIX\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tPHB\tSYS\t0-47\t0\t\tN/A\n"
    "GPU2\tSYS\tPHB\t X \tSYS\t48-95\t1\t\tN/A\n"
    "NIC0\tPIX\tSYS\tSYS\t X \n\n"
    "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
)


def test_parse_topology_reads_the_gpu_pairs():
    topo = parse_topology(TOPO)
    assert topo == {"gpus": 3, "links": {"0-1": "NV18", "0-2": "SYS", "1-2": "PHB"}}
    assert parse_topology("No devices were found") == {"gpus": 0, "links": {}}


def test_message_sizes_and_bus_bandwidth_follow_nccl_tests():
    sizes = message_sizes()
    assert sizes[0] == 8 * KiB and sizes[-1] == 2**30 and len(sizes) == 18
    assert message_sizes(lo=12, hi=1000, factor=3) == [12, 36, 108, 324, 972]
    algbw, busbw = bus_bandwidth(3_000_000, 1e-3, 4)
    assert algbw == pytest.approx(3.0) and busbw == pytest.approx(3.0 * 2 * 3 / 4)
    assert bus_bandwidth(1000, 1e-6, 2)[1] == pytest.approx(1.0)  # two ranks: busbw = algbw
    with pytest.raises(ValueError, match="factor >= 2"):
        message_sizes(factor=1)


@pytest.mark.timeout(120)
def test_all_reduce_sweep_on_two_gloo_ranks():
    result = all_reduce_ranks(2, sizes=[4 * KiB, 36 * KiB], iters=3, warmup=1)
    assert result["ranks"] == 2
    assert [r["bytes"] for r in result["rows"]] == [4 * KiB, 36 * KiB]
    for row in result["rows"]:
        assert row["time_us"] > 0
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])  # 2(n-1)/n = 1 at n = 2
