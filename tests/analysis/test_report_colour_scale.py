"""The report's traffic matrices' colour scale (analysis.report_figures.matrix_norm, shared by the static and the
interactive matrices)."""
from __future__ import annotations

import numpy as np

from dlcsniff.analysis.report_figures import matrix_norm


def test_nearly_equal_cells_share_a_colour():
    # a 4-rank ring's links, as a real Gloo capture shows them: 15,728,656 and 15,728,624 bytes
    ring = np.full((4, 4), np.nan)
    for rank in range(4):
        ring[rank, (rank + 1) % 4] = 15_728_656 if rank % 2 else 15_728_624
    norm = matrix_norm(ring)
    shades = norm(ring[np.isfinite(ring)])
    assert np.ptp(shades) < 0.01 and 0.4 < shades.min() < 0.6


def test_a_matrix_spanning_decades_uses_the_whole_scale():
    norm = matrix_norm(np.array([[np.nan, 1e3], [1e6, 0.0]]))
    assert norm(1e3) == 0 and norm(1e6) == 1


def test_an_empty_matrix_has_no_scale():
    assert matrix_norm(np.array([[np.nan, 0.0]])) is None
