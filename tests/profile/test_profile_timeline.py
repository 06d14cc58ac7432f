"""Timeline pictures: rendered from a CPU trace and from the handmade GPU-like trace."""

from pathlib import Path

import matplotlib.image as mpimg
import pytest
import torch

import fuselab.profile as fp
from fuselab.profile.trace import Trace

DATA = Path(__file__).resolve().parents[1] / "data" / "profile"
PNG = b"\x89PNG\r\n\x1a\n"


def _check_png(path: Path) -> tuple[int, int]:
    assert path.read_bytes()[:8] == PNG
    assert path.stat().st_size > 10_000  # a drawn picture, not an empty canvas
    height, width = mpimg.imread(path).shape[:2]
    return width, height


def test_timeline_of_a_cpu_trace(tmp_path):
    a = torch.randn(128, 128)
    result = fp.profile_callable(lambda: torch.relu(a @ a), label="mm", warmup=0, iters=3, out_dir=tmp_path)
    path = fp.render_timeline(result.trace, tmp_path / "t.png", title="cpu")
    width, height = _check_png(path)
    assert width > 1000 and 150 < height < 1000


def test_timeline_of_a_gpu_like_trace_and_a_window(tmp_path):
    trace = Trace.load(DATA / "runahead_gpu_like_print.json")
    _, full_height = _check_png(fp.render_timeline(trace, tmp_path / "full.png"))
    _, zoom_height = _check_png(fp.render_timeline(trace, tmp_path / "zoom.png", window_ms=(0.4, 0.6)))
    assert zoom_height == full_height  # same lanes, fewer events
    assert full_height > 300  # five lanes (ranges, CPU ops, CUDA API, GPU ranges, a stream)
    with pytest.raises(ValueError, match="empty time window"):
        fp.render_timeline(trace, tmp_path / "bad.png", window_ms=(1.0, 1.0))
