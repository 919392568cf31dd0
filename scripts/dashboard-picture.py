#!/usr/bin/env python3
"""Draws the Grafana dashboard's panels (chart/files/dashboard.json) from real Prometheus data.

  scripts/dashboard-picture.py DATA.json [OUT.png]

DATA.json is what the `alerts` suite writes with VMDHCP_DASHBOARD_DATA=DATA.json: every panel's
queries evaluated with query_range over the suite's run against a real Prometheus scraping the
fleet, and the run's events (the leading agent killed, a squatter, the pool filled and emptied).
OUT.png (default docs/dashboard.png) is one plot per panel, in the dashboard's order, with the
events as dashed lines: a picture of what the dashboard shows, from data, not a mock-up.

  VMDHCP_DASHBOARD_DATA=/tmp/dash.json scripts/test.sh -p vmdhcp-integration --test alerts
  scripts/dashboard-picture.py /tmp/dash.json

Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""

import json
import math
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

COLUMNS = 4
UNITS = {"s": "seconds", "ops": "per second", "reqps": "per second", "pps": "per second", "short": ""}


def legend(fmt, metric):
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    if not fmt:
        return ",".join(f"{k}={v}" for k, v in sorted(metric.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)


def main(argv):
    if len(argv) not in (2, 3):
        sys.stderr.write(__doc__)
        return 2
    data = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    out = Path(argv[2]) if len(argv) == 3 else Path(__file__).resolve().parent.parent / "docs/dashboard.png"
    start = data["start"]
    panels = data["panels"]
    rows = math.ceil(len(panels) / COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(5.2 * COLUMNS, 3.1 * rows), squeeze=False)
    events = [(label, t - start) for label, t in data["events"]]
    for ax, panel in zip(axes.flat, panels):
        for target in panel["targets"]:
            for series in target["result"]:
                points = [(float(t) - start, float(v)) for t, v in series["values"]]
                points = [(t, v) for t, v in points if not math.isnan(v)]
                if not points:
                    continue
                xs, ys = zip(*points)
                ax.plot(xs, ys, linewidth=1.2, label=legend(target.get("legend"), series["metric"]))
        for i, (_, t) in enumerate(events):
            ax.axvline(t, color="grey", linestyle="--", linewidth=0.7)
            ax.text(t, 1.0, str(i + 1), transform=ax.get_xaxis_transform(), fontsize=7,
                    color="grey", ha="left", va="top")
        ax.set_title(panel["title"], fontsize=9)
        unit = UNITS.get(panel.get("unit") or "short", panel.get("unit") or "")
        if unit:
            ax.set_ylabel(unit, fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=6, loc="upper left", ncol=2 if len(handles) > 4 else 1, framealpha=0.6)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run", fontsize=7)
    fig.suptitle("vmdhcp dashboard, from the alerts suite's Prometheus — events: "
                 + "; ".join(f"{i + 1} {label}" for i, (label, _) in enumerate(events)), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
