"""A timeline of what each rollout server is doing, sampled from its Prometheus metrics while a job
runs: running requests, whether the running batch decodes speculatively, the drafter version. It
feeds the report's SD on/off timeline."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import requests
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

WANTED = {"sglang:num_running_reqs": "running", "tlt_sd_enabled": "sd_enabled", "tlt_drafter_version": "drafter_version"}


class TimelinePoint(BaseModel):
    time: float  # unix seconds
    server: int  # index in the server list
    running: int
    sd_on: bool  # speculating, with requests running (the gauge keeps its last value when idle)
    drafter_version: int


def sample_server(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """The wanted metrics of one server (missing ones absent)."""
    text = requests.get(f"{url}/metrics", timeout=timeout_s).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = WANTED.get(sample.name)
            if key is not None and key not in found:
                found[key] = sample.value
    return found


class TimelineRecorder:
    """Samples every server each `interval_s` on a thread, appending points to `path` (JSONL)."""

    def __init__(self, urls: Sequence[str], path: Path, interval_s: float = 0.25) -> None:
        self.urls, self.path, self.interval_s = list(urls), path, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sd-timeline", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        with self.path.open("a") as out:
            while not self._stop.wait(self.interval_s):
                for index, url in enumerate(self.urls):
                    try:
                        found = sample_server(url)
                    except requests.RequestException:
                        continue  # a server restarting: a gap in its line
                    running = int(found.get("running", 0))
                    point = TimelinePoint(
                        time=time.time(),
                        server=index,
                        running=running,
                        sd_on=bool(found.get("sd_enabled", 0)) and running > 0,
                        drafter_version=int(found.get("drafter_version", 0)),
                    )
                    out.write(point.model_dump_json() + "\n")
                out.flush()


def read_timeline(path: Path) -> list[TimelinePoint]:
    if not path.exists():
        return []
    return [TimelinePoint.model_validate(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
