"""Reading one sample of a Prometheus text exposition, as the tests scrape /metrics."""

from __future__ import annotations

import re

import requests


def metric_value(url: str, name: str) -> float:
    """The first sample of metric `name` at `url`/metrics (0.0 when absent)."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    match = re.search(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0
