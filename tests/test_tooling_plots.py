"""The plots on synthetic results: what each bar claims adds up, one series per distinct kernel, the
1.15x target drawn, no label collides with another or with a reference line, and every title names
the GPU and the versions."""
import json

import matplotlib
import pytest

matplotlib.use("Agg")

import helpers  # noqa: E402
import report  # noqa: E402
from conftest import ROOT  # noqa: E402
from tooling_data import METHODS, kernel_rows, procedure  # noqa: E402

ENV = {"gpu": "Synthetic GPU", "torch": "2.11.0", "triton": "3.6.0", "bitsandbytes": "0.50.2", "unsloth": "2026.10.9",
       "date": "2026-11-22 10:00 UTC", "peak_bandwidth_gbs": 4800.0}
VERSIONS = helpers.versions_line(ENV)
MERGED = "bnb dequantize_4bit / unsloth classic (same 3 kernels)"


def _renderer(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _legend_covers_no_text(fig):
    renderer = _renderer(fig)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    texts = [t for ax in fig.axes for t in ax.texts if t.get_text()]
    assert legends and texts
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for text in texts:
            assert not box.overlaps(text.get_window_extent(renderer)), text.get_text()


def _labels_clear_of_lines(fig):
    """No text inside an axes crosses one of its horizontal reference lines (axhline or hlines)."""
    renderer = _renderer(fig)
    for ax in fig.axes:
        lines = [(ax.get_window_extent(renderer).x0, ax.get_window_extent(renderer).x1,
                  line.get_transform().transform((0, line.get_ydata()[0]))[1])
                 for line in ax.get_lines() if len(set(line.get_ydata())) == 1]
        for collection in ax.collections:
            for segment in getattr(collection, "get_segments", lambda: [])():
                (x0, y), (x1, _) = ax.transData.transform(segment)
                lines.append((x0, x1, y))
        assert lines, "no reference line drawn"
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            for x0, x1, y in lines:
                assert not (box.x0 < x1 and box.x1 > x0 and box.y0 <= y <= box.y1), (
                    f"the label {text.get_text()} sits on a line at {y:.0f} px")


def _labels_apart(fig):
    """No two value labels overlap (4-digit GB/s labels on three bars a group collided once)."""
    renderer = _renderer(fig)
    for ax in fig.axes:
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if t.get_text()]
        for i, (text, box) in enumerate(boxes):
            for other, other_box in boxes[i + 1:]:
                assert not box.overlaps(other_box), f"the labels {text} and {other} overlap"


def _labels(ax):
    return ax.get_legend_handles_labels()[1]


def _has_target_line(ax):
    return any(list(line.get_ydata()) == [1.15, 1.15] for line in ax.get_lines())


def test_kernel_speedup_plot_has_one_series_per_kernel_and_the_target(tmp_path):
    rows = kernel_rows()
    fig = report.plot_kernel_speedups(rows, METHODS[1:], ENV, tmp_path / "s.png")
    ax = fig.axes[0]
    assert VERSIONS in ax.get_title() and "GPU time" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8192x2048\nfp16", "4096x1024\nbf16", "28672x8192\nbf16"]
    assert [label for label in _labels(ax) if label.startswith("vs ")] == [
        "vs unsloth fast_dequantize (fused Triton, default)", f"vs {MERGED}"]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == sorted(round(r[f"{b}_us"] / r["ours_us"], 6) for r in rows for b in ("unsloth_fused", "bnb"))
    assert _has_target_line(ax)
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{h:.2f}x" for h in heights)
    _labels_clear_of_lines(fig)
    _legend_covers_no_text(fig)
    _labels_apart(fig)
    assert (tmp_path / "s.png").stat().st_size > 1000


def test_bandwidth_plot_draws_the_ceiling_as_a_reference_clear_of_the_labels(tmp_path):
    rows = kernel_rows()
    fig = report.plot_bandwidth(rows, METHODS, ENV, 4250.0, tmp_path / "b.png")
    ax = fig.axes[0]
    assert VERSIONS in ax.get_title() and "GPU time" in ax.get_title()
    assert len(ax.patches) == 3 * len(rows)  # bars are distinct kernels only: ours, fused, bnb (= classic)
    assert MERGED in _labels(ax) and "datasheet peak 4800 GB/s" in _labels(ax)
    ceilings = [c for c in ax.collections if "ceiling" in (c.get_label() or "")]
    assert len(ceilings) == 1 and len(ceilings[0].get_segments()) == len(rows)
    assert [s[0][1] for s in ceilings[0].get_segments()] == [r["ceiling_gbs"] for r in rows]
    _labels_clear_of_lines(fig)
    _legend_covers_no_text(fig)
    _labels_apart(fig)


@pytest.mark.parametrize("no_fast_launch", [False, True])
def test_procedure_plot_has_the_target_line(tmp_path, no_fast_launch):
    result = procedure(with_no_fast_launch=no_fast_launch)
    fig = report.plot_procedure(result, ENV, tmp_path / "p.png")
    ax = fig.axes[0]
    assert VERSIONS in ax.get_title() and "wall clock" in ax.get_title()
    assert _has_target_line(ax)
    ours = [o for o in helpers.OURS if o in result]
    assert [round(p.get_height(), 9) for p in ax.patches] == [
        round(result[b]["median_s"] / result[o]["median_s"], 9) for o in ours for b in METHODS[1:]]
    assert [label for label in _labels(ax) if label.startswith("baseline /")] == [
        f"baseline / {helpers.METHODS[o].column}" for o in ours]
    _labels_clear_of_lines(fig)
    _legend_covers_no_text(fig)


def test_time_split_bars_end_at_the_wall_clock(tmp_path):
    result = procedure()
    fig = report.plot_time_split(result, ENV, tmp_path / "t.png")
    assert VERSIONS in fig.get_suptitle() and "CUPTI" in fig.get_suptitle()
    rows = helpers.time_split(result)
    for ax, case in zip(fig.axes, ("case 0", "case 1")):
        here = [r for r in rows if r["case"] == case]
        assert "fp16" in ax.get_title() or "bf16" in ax.get_title()
        host, rest, gpu, overlap = [ax.patches[i * len(here):(i + 1) * len(here)] for i in range(4)]
        for r, h, g, o, s in zip(here, host, gpu, overlap, rest):
            assert h.get_x() == 0 and h.get_width() == pytest.approx(r["host_us"])
            assert g.get_x() + g.get_width() == pytest.approx(r["wall_us"])  # the stack ends at the wall clock
            assert g.get_width() == pytest.approx(r["gpu_us"])
            assert o.get_width() == pytest.approx(max(0.0, -r["rest_us"]))  # overlap hatched, where there is one
            assert s.get_width() == pytest.approx(max(0.0, r["rest_us"]))
        assert max(p.get_x() + p.get_width() for p in ax.patches) <= max(r["wall_us"] for r in here) + 1e-9
    assert any(r["rest_us"] < 0 for r in rows)  # the synthetic data has overlap to draw
    _legend_covers_no_text(fig)
    assert (tmp_path / "t.png").stat().st_size > 1000


@pytest.mark.parametrize("results", sorted((ROOT / "results").glob("*/notebook.json")), ids=lambda p: p.parent.name)
def test_plots_of_the_committed_results_keep_their_labels_apart(tmp_path, results):
    # four weights, three kernels, four-digit GB/s: the figure a reviewer sees
    data = json.loads(results.read_text())
    rows, methods = data["kernel"], [m for m in helpers.METHODS if f"{m}_gbs" in data["kernel"][0]]
    for fig in (report.plot_bandwidth(rows, methods, data["environment"], data.get("device_copy_gbs")),
                report.plot_kernel_speedups(rows, [m for m in methods if m != "ours"], data["environment"])):
        _labels_apart(fig)
        _labels_clear_of_lines(fig)
