"""Parsers for perf IMC output and cachegrind files, and the slope method."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runtime.hw_counters import (
    ImcSample,
    parse_cachegrind_out,
    parse_perf_stat,
    slope_mb_per_token,
)

DATA = Path(__file__).parent / "data"
MIB = 1024**2


def test_csv_sums_every_box():
    s = parse_perf_stat((DATA / "perf_imc_two_boxes.csv").read_text())
    assert s.boxes == 2
    assert s.read_bytes == pytest.approx((1187.53 + 1190.12) * MIB)
    assert s.write_bytes == pytest.approx((210.40 + 208.77) * MIB)
    assert s.seconds == pytest.approx(5.012861270)


def test_table_format_and_not_counted():
    s = parse_perf_stat((DATA / "perf_imc_table.txt").read_text())
    assert s.boxes == 2 and s.write_bytes == 0
    assert s.read_bytes == pytest.approx((1187.53 + 1190.12) * MIB)


def test_one_box_would_halve_the_figure():
    text = (DATA / "perf_imc_two_boxes.csv").read_text()
    one = parse_perf_stat("\n".join(line for line in text.splitlines() if "_1/" not in line))
    both = parse_perf_stat(text)
    assert one.read_bytes == pytest.approx(both.read_bytes / 2, rel=0.01)


def test_cas_count_lines_are_64_bytes():
    s = parse_perf_stat("1000,,uncore_imc_0/cas_count_read/,1,100.00,,\n2000,,uncore_imc_1/cas_count_read/,1,100.00,,\n")
    assert s.read_bytes == 3000 * 64 and s.boxes == 2


def test_slope_cancels_load_and_subtracts_idle():
    per_token, load, idle_rate = 2.0e9, 7.0e9, 1.0e8  # bytes
    run = lambda n, secs: ImcSample(load + n * per_token + idle_rate * secs, 0, secs, 2)  # noqa: E731
    idle = ImcSample(idle_rate * 10, 0, 10, 2)
    assert slope_mb_per_token(32, run(32, 4.0), 128, run(128, 12.0), idle) == pytest.approx(2000.0)
    assert slope_mb_per_token(32, run(32, 4.0), 128, run(128, 12.0), None) > 2000.0
    with pytest.raises(ValueError):
        slope_mb_per_token(8, run(8, 1), 8, run(8, 1), idle)


def test_cachegrind_out():
    text = "desc: I1 cache: ...\ncmd: python\nevents: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw\nsummary: 100 1 1 50 10 7 20 5 3\n"
    s = parse_cachegrind_out(text)
    assert (s.ll_read_misses, s.ll_write_misses, s.dram_bytes) == (7, 3, 640)
    assert s.jit_misses == 0
    # misses in code without symbols (numba's JIT kernels) are attributed separately
    per_fn = ("events: Ir DLmr DLmw\nfl=/usr/lib/libc.so\nfn=memcpy\n10 5 2 1\n"
              "fl=???\nfn=???\n0 100 40 6\n0 50 4 0\nfl=(3) ceval.c\nfn=(9) eval\n7 9 3 3\nsummary: 169 49 10\n")
    s = parse_cachegrind_out(per_fn)
    assert (s.ll_read_misses, s.ll_write_misses, s.jit_misses, s.jit_dram_bytes) == (49, 10, 50, 3200)
    with pytest.raises(ValueError, match="cache-sim"):
        parse_cachegrind_out("events: Ir\nsummary: 5\n")
    with pytest.raises(ValueError):
        parse_cachegrind_out("garbage")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_cachegrind_agrees_with_software_count_on_sparse_reduction(exported, tmp_path):
    """The dense → exact-sparse reduction of the weight traffic, simulated vs counted, within 15 %.

    Slow (four Python runs under cachegrind); run with ``pytest -m slow``. The figure is also
    produced by ``aios-run bench --cachegrind`` (docs/commands.md, docs/benchmarks.md).
    """
    from runtime.generate import generate
    from runtime.hw_counters import cachegrind_mb_per_token
    from runtime.model import Model

    path, _ = exported("tiny-falcon-relu", "f32")
    sim, soft = {}, {}
    for mode in ("dense", "sparse"):
        sim[mode] = cachegrind_mb_per_token(str(path), mode, 2, 6, 1 << 20, tmp_path)["kernel_mb_per_token"]
        m = Model(path, mode=mode)
        _, tm = generate(m, list(range(1, 17)), 6)
        soft[mode] = tm.decode_bytes["weights"] / tm.generated / 1e6
    assert sim["dense"] == pytest.approx(soft["dense"], rel=0.15)
    r_sim, r_soft = 1 - sim["sparse"] / sim["dense"], 1 - soft["sparse"] / soft["dense"]
    assert r_sim == pytest.approx(r_soft, rel=0.15)
