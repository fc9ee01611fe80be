"""The report's what-if section: the job's mean iteration time against every node's link rate, predicted by
`dlcsniff simulate` (analysis.simulate, SimGrid) at rates from WHATIF_RATES_BIT_S and at the captured network's
own rate, beside the capture's measured point. A job the simulation cannot replay (no training iteration, the
simulator missing) gets no curve, and the report says why."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.load import AnalysisError

WHATIF_RATES_BIT_S = (10e6, 25e6, 50e6, 100e6, 250e6, 500e6, 1e9, 2.5e9, 5e9, 10e9, 25e9, 100e9)
PREDICTED_COLOR, MEASURED_COLOR = "#1f77b4", "#d62728"


@dataclass(frozen=True, slots=True)
class WhatIfCurve:
    curve: pd.DataFrame | None            # rate_bit_s, iteration_s_mean (the link rates, predicted)
    measured_iteration_s: float | None
    captured_link_bit_s: float | None     # the captured network's link rate, as calibrated
    note: str                             # how it was made, or why there is no curve


def whatif_curve(job: JobModel) -> WhatIfCurve:
    from dlcsniff.analysis.simulate import bandwidth_curve

    try:
        curve, captured = bandwidth_curve(job, list(WHATIF_RATES_BIT_S))
    except AnalysisError as exc:
        return WhatIfCurve(None, None, None, f"no what-if: {exc}")
    if curve["iteration_s_mean"].isna().all() or captured["measured_iteration_s_mean"] is None:
        return WhatIfCurve(None, None, None, "no what-if: the job has no training iteration with all its phases "
                                             "(`dlcsniff simulate` reports its span instead)")
    return WhatIfCurve(curve, captured["measured_iteration_s_mean"], captured["link_bit_s"],
                       "SimGrid replays of the captured job with every node's link at each rate (the hosts and the "
                       "computation as captured)")


def whatif_figure(found: WhatIfCurve) -> Figure:
    figure = Figure(figsize=(8, 4.5))
    axis = figure.subplots()
    axis.plot(found.curve["rate_bit_s"] / 1e6, found.curve["iteration_s_mean"] * 1e3, marker="o", markersize=3,
              color=PREDICTED_COLOR, label="predicted (dlcsniff simulate)")
    axis.plot([found.captured_link_bit_s / 1e6], [found.measured_iteration_s * 1e3], marker="D", markersize=8,
              linestyle="", color=MEASURED_COLOR, label="measured (the capture)")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("every node's link rate, each way (Mbit/s)")
    axis.set_ylabel("mean iteration time (ms)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    return figure


def _column(values: np.ndarray, digits: int) -> list:
    return [None if not np.isfinite(value) else round(float(value), digits) for value in values]


def whatif_chart(found: WhatIfCurve) -> dict:
    """An xy spec of analysis.report_charts: the predicted curve and the measured point."""
    rates = found.curve["rate_bit_s"].to_numpy(np.float64) / 1e6
    predicted = found.curve["iteration_s_mean"].to_numpy(np.float64) * 1e3
    measured_x, measured_y = found.captured_link_bit_s / 1e6, found.measured_iteration_s * 1e3
    tip = [{"label": "link rate (Mbit/s)", "key": "x", "format": "number"},
           {"label": "mean iteration time", "key": "y", "format": "ms"}]
    ys = np.concatenate([predicted[np.isfinite(predicted)], [measured_y]])
    return {"type": "xy", "title": "mean iteration time against link rate", "x_log": True, "y_log": True,
            "x_range": [float(rates.min()) / 1.5, float(rates.max()) * 1.5],
            "y_range": [float(ys.min()) / 1.5, float(ys.max()) * 1.5],
            "x_format": "number", "y_format": "ms", "x_label": "every node's link rate, each way (Mbit/s)",
            "y_label": "mean iteration time (ms)", "height_px": 360,
            "legend": [{"label": "predicted (dlcsniff simulate)", "color": PREDICTED_COLOR},
                       {"label": "measured (the capture)", "color": MEASURED_COLOR}],
            "series": [
                {"name": "predicted", "legend": 0, "mode": "line", "x": _column(rates, 3),
                 "y": _column(predicted, 4), "tip": tip},
                {"name": "measured", "legend": 1, "mode": "points", "radius": 6, "edge": True,
                 "x": _column(np.array([measured_x]), 3), "y": _column(np.array([measured_y]), 4), "tip": tip},
            ]}
