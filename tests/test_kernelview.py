"""ftlib.views.kernels on synthetic kernel rows: measured ceilings, floors, speed-ups, figures, docstrings."""

from __future__ import annotations

import pytest
from synthetic_results import CEIL, NORM_BYTES, write_kernel_rows

from ftlib.views import kernels as kernelview


@pytest.fixture()
def krows(tmp_path, monkeypatch):
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path / "results"))
    write_kernel_rows(tmp_path / "results")
    return kernelview.kernel_rows()


def test_ceilings_are_read_from_the_ceiling_rows(krows):
    c = kernelview.ceilings(krows)["h200"]
    assert c["bandwidth"] == pytest.approx(CEIL["copy"])
    assert c["fp32"] == pytest.approx(CEIL["matmul fp32"]) and c["tf32"] == pytest.approx(CEIL["matmul tf32"])
    assert len(kernelview.ceiling_table.rows(krows)) == 4


def test_table_reads_each_row_against_the_measured_ceiling(krows):
    t = {(r["op"], r["variant"]): r for r in kernelview.kernel_table.rows(krows)}
    tri = t[("rmsnorm", "v3 triton")]
    floor = NORM_BYTES / (CEIL["copy"] * 1e9) * 1e6
    assert tri["floor µs"] == pytest.approx(floor)
    assert tri["of ceiling"] == pytest.approx(floor / 20.0)  # graph time is the one read
    assert tri["eager / graph"] == pytest.approx(420.0 / 20.0)
    assert tri["vs PyTorch"] == pytest.approx(60.0 / 20.0) and tri["vs compile"] == pytest.approx(25.0 / 20.0)
    assert tri["rate"] == pytest.approx(NORM_BYTES / 20e-6 / 1e9) and tri["unit"] == "GB/s"
    # attention is compute-bound: its floor uses the matmul rate of its own precision (tf32 here)
    att = t[("attention", "v4 triton tf32")]
    assert att["unit"] == "TFLOP/s"
    fl = 4 * 32 * 8 * 256 * 256 * 32 / 2 * 3.5
    assert att["floor µs"] == pytest.approx(max(fl / (CEIL["matmul tf32"] * 1e12),
                                                6 * (32 * 8 * 256 * 32 + 32 * 256 * 32) * 4 / 4000e9) * 1e6)
    # not capturable: no graph time, the status and the reason are in the note
    fe = t[("adamw", "v1 foreach")]
    assert fe["graph µs"] is None and fe["eager µs"] == 1500.0 and "unsupported" in fe["note"]
    assert list(kernelview.KERNEL_TABLE_OPS).index("rmsnorm") < list(kernelview.KERNEL_TABLE_OPS).index("adamw")


def test_verdicts_name_the_fastest_in_graph(krows):
    lines = kernelview.fastest_variants(kernelview.kernel_table.rows(krows))
    rms = next(line for line in lines if "RMSNorm" in line)
    assert "fastest in a graph is v3 triton" in rms and "3.00x faster than pytorch (v1 eager)" in rms
    assert "1.25x faster than compile (v2 torch.compile)" in rms
    # TF32 products are never ranked against strict fp32's: SDPA (fp32) beats our strict-fp32 kernel, and the
    # TF32 variant is a case of its own, with no PyTorch variant of that precision to beat.
    strict, tf32 = [line for line in lines if "attention" in line]
    assert "fp32 [run" in strict and "fastest in a graph is v2 sdpa expand" in strict
    assert "2.00x faster than triton (v3 triton ieee)" in strict
    assert "fp32 (TF32 products) [run" in tf32 and "fastest in a graph is v4 triton tf32" in tf32
    assert "faster than pytorch" not in tf32


def test_figure_shows_the_condensed_view_one_row_per_case(krows):
    table = kernelview.kernel_table.rows(krows)
    fig = kernelview.kernel_figure(table, "h200")
    summary = kernelview.kernel_summary.rows(table)
    ops = {t["op"] for t in summary}
    assert len(fig.data) == 3 * len(ops)  # PyTorch, compile and the fastest Triton variant per op
    assert all(len(tr.y) == sum(t["op"] == op for t in summary)
               for tr, op in zip(fig.data[::3], [o for o in kernelview.KERNEL_TABLE_OPS if o in ops]))
    assert fig.layout.xaxis.type == "log"
    # row names: each case without the words every case of its op shares (those go to the panel title)
    assert kernelview._common_prefix(["(8192, 256) fp32", "(8192, 256) bf16"]) == ("(8192, 256)", ["fp32", "bf16"])
    assert kernelview._common_prefix(["M=8192 C=256 bf16"]) == ("M=8192 C=256 bf16", ["as titled"])  # one case
    # a case whose run timed no such implementation: no marker, and the subtitle says why
    has_gap = any(t.get(c) is None for t in summary for c in ("PyTorch µs", "compile µs", "best Triton µs"))
    assert ("no marker: that case's run timed no such implementation" in fig.layout.title.text) == has_gap
    cols = ("PyTorch µs", "compile µs", "best Triton µs")
    whole = {t["op"] for t in summary if all(t.get(c) is not None for c in cols)}  # ops with every marker
    complete = [t for t in table if t["op"] in whole]
    assert complete and "no marker" not in kernelview.kernel_figure(complete, "h200").layout.title.text
    first = sorted(whole)[0]  # its compiled variants left out: their markers go, and the subtitle comes
    gone = [t for t in complete if not (t["op"] == first and t.get("impl") == "compile")]
    assert "no marker" in kernelview.kernel_figure(gone, "h200").layout.title.text


def _bias_row(variant, impl, us, run=None, commit=None, date=None):
    r = {"device_slug": "h200", "op": "bias_grad", "shape": {"M": 8192, "N": 768}, "dtype": "fp32",
         "variant": variant, "impl": impl, "timing": "graph", "status": "ok", "median_us": us,
         "bound": "memory", "bytes": 8192 * 768 * 4}
    return r | {k: v for k, v in (("run_id", run), ("commit", commit), ("date", date)) if v}


def test_ratios_pair_rows_of_one_run_only():
    """A Triton row of one run is never divided by a compile or PyTorch row of another: the ratio is None, and
    the condensed view reads the run that timed all three. Rows without a run_id are one run per commit and day."""
    rows = [_bias_row("v1 eager sum(0)", "pytorch", 30.0, commit="aaa", date="2026-12-03T10:00:00Z"),
            _bias_row("v2 torch.compile", "compile", 12.0, commit="aaa", date="2026-12-03T10:01:00Z"),
            _bias_row("v3 triton column sum", "triton", 20.0, commit="aaa", date="2026-12-03T10:02:00Z"),
            _bias_row("v4 triton column sum 64x64, 4/SM", "triton", 6.0, commit="bbb", date="2026-12-04T09:00:00Z"),
            _bias_row("v5 triton column sum 32x64, 4/SM", "triton", 8.0, run="r9", commit="aaa",
                      date="2026-12-03T11:00:00Z")]
    t = {r["variant"]: r for r in kernelview.kernel_table.rows(rows)}
    assert t["v3 triton column sum"]["run"] == "aaa 2026-12-03"
    assert t["v3 triton column sum"]["vs compile"] == pytest.approx(12.0 / 20.0)
    assert t["v3 triton column sum"]["vs PyTorch"] == pytest.approx(30.0 / 20.0)
    for other in ("v4 triton column sum 64x64, 4/SM", "v5 triton column sum 32x64, 4/SM"):  # other runs: no ratio
        assert t[other]["vs compile"] is None and t[other]["vs PyTorch"] is None
    assert t["v5 triton column sum 32x64, 4/SM"]["run"] == "r9"
    (s,) = kernelview.kernel_summary.rows(list(t.values()))
    assert (s["run"], s["best Triton µs"], s["compile µs"], s["PyTorch µs"]) == ("aaa 2026-12-03", 20.0, 12.0, 30.0)
    assert s["vs compile"] == pytest.approx(12.0 / 20.0)
    (line,) = kernelview.fastest_variants(list(t.values()))
    assert "run aaa 2026-12-03" in line and "v4" not in line and "v5" not in line
    # a case only one run timed with Triton and another with compile: a line, with no ratio
    (alone,) = kernelview.kernel_summary.rows(kernelview.kernel_table.rows(rows[1:2] + rows[3:4]))
    assert alone["best Triton µs"] == 6.0 and alone["compile µs"] is None and alone["vs compile"] is None


@pytest.mark.parametrize("op", ("rmsnorm", "layernorm", "cross_entropy", "adamw", "attention", "residual_norm"))
def test_kernel_math_quotes_the_jit_docstrings(op):
    md = kernelview.kernel_math(op)
    assert md.count(f"kernels/{op}") >= 1 and "```text" in md
    if op == "rmsnorm":
        assert "rstd" in md
    if op == "residual_norm":  # its Philox keep mask lives in kernels/dropout_mask.py
        assert "kernels/dropout_mask.py::_keep" in md and "persistent" in md


def test_floor_uses_the_rate_of_the_rows_precision():
    ceil = {"bandwidth": 4000.0, "fp32": 50.0, "tf32": 400.0}
    row = {"bytes": 4e6, "flops": 1e9, "precision": "fp32"}
    assert kernelview.floor_us(row, ceil) == pytest.approx(1e9 / 50e12 * 1e6)  # compute-bound: 20 us > 1 us
    assert kernelview.floor_us({**row, "precision": "tf32x3"}, ceil) == pytest.approx(1e9 / (400e12 / 3) * 1e6)
    assert kernelview.floor_us({**row, "precision": "bf16"}, ceil) == pytest.approx(4e6 / 4000e9 * 1e6)  # no bf16
    assert kernelview.floor_us(row, {}) is None
    # The weight-gradient driver's fp32 cases ran TF32 products (rows stored before it said so): TF32's rate,
    # and a case name that says it; another op's fp32 row keeps the strict fp32 rate.
    wgrad = {**row, "op": "wgrad", "dtype": "fp32", "shape": {"M": 8192, "N": 256, "K": 256}}
    assert kernelview.floor_us(wgrad, ceil) == pytest.approx(1e9 / 400e12 * 1e6)
    assert kernelview.case_label(wgrad) == "dW (256, 256) over M=8192 fp32 (TF32 products)"
    assert kernelview.case_label({**wgrad, "dtype": "bf16", "precision": "bf16"}) == "dW (256, 256) over M=8192 bf16"


def test_gemm_cases_are_named_by_their_roles():
    """The GEMM drivers' shapes are stored as sorted dicts; their labels name each dimension."""
    wgrad = {"op": "wgrad", "shape": {"K": 256, "M": 8192, "N": 320}, "dtype": "bf16"}
    assert kernelview.case_label(wgrad) == "dW (320, 256) over M=8192 bf16"
    mlp = {"op": "gelu_mlp", "shape": {"C": 768, "F": 3072, "M": 8192, "bias": True}, "dtype": "bf16"}
    assert kernelview.case_label(mlp) == "M=8192 C=768 F=3072 +bias bf16"


def test_stored_rows_of_triton_variants_named_without_triton_count_as_triton():
    """bias_grad_dev's tile variants were stored as impl 'pytorch' ("v4 column sum 64x64, 4/SM"): the table
    counts them as Triton, so they are neither the PyTorch baseline of 'vs PyTorch' nor labelled pytorch."""
    def row(variant, impl, us):
        return {"device_slug": "h200", "op": "bias_grad", "shape": {"M": 8192, "N": 768}, "dtype": "fp32",
                "variant": variant, "impl": impl, "timing": "graph", "status": "ok", "median_us": us,
                "bound": "memory", "bytes": 8192 * 768 * 4}

    rows = [row("v1 eager sum(0)", "pytorch", 30.0), row("v2 torch.compile", "compile", 12.0),
            row("v3 triton column sum", "triton", 20.0), row("v4 column sum 64x64, 4/SM", "pytorch", 10.0),
            row("v4 triton column sum 64x64, 4/SM", "triton", 10.0)]
    t = {r["variant"]: r for r in kernelview.kernel_table.rows(rows)}
    assert t["v4 column sum 64x64, 4/SM"]["impl"] == "triton" == t["v4 triton column sum 64x64, 4/SM"]["impl"]
    assert t["v1 eager sum(0)"]["impl"] == "pytorch" and t["v2 torch.compile"]["impl"] == "compile"
    assert t["v3 triton column sum"]["vs PyTorch"] == pytest.approx(30.0 / 20.0)  # not 10 / 20: v4 is ours
    assert t["v4 column sum 64x64, 4/SM"]["vs compile"] == pytest.approx(12.0 / 10.0)
    assert kernelview.row_impl({"variant": "v1 cuBLAS into fp32", "impl": "pytorch"}) == "pytorch"
