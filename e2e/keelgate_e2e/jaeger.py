"""A real trace collector for the e2e tests: Jaeger (on the OpenTelemetry Collector), in memory.

Why it exists: the tracing tests must send spans the way a platform would (OTLP over HTTP, the
operator's and the step pods' own exporters) and read back what a backend made of them, so
Jaeger v2 is built from Go modules (``keelgate_e2e.build``) and started here with in-memory
storage, an OTLP/HTTP receiver and its query API on free 127.0.0.1 ports. It is test
infrastructure only, and must never bind anything but 127.0.0.1.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from keelgate_e2e import build, procs
from keelgate_e2e.procs import LOOPBACK, Proc

JSON = dict[str, Any]

CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
receivers:
  otlp:
    protocols:
      http:
        endpoint: {host}:{otlp}
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: {host}:{query}
    grpc:
      endpoint: {host}:{grpc}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


class Jaeger:
    """A running Jaeger: ``otlp_endpoint`` takes spans, ``traces`` reads them back."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.proc: Proc | None = None
        self.ports: dict[str, int] = {}

    @property
    def otlp_endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['otlp']}"

    @property
    def query(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['query']}"

    def start(self) -> Jaeger:
        binary = build.ensure(("jaeger",))["jaeger"].path
        self.ports = {name: procs.free_port() for name in ("otlp", "query", "grpc")}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.run_dir / "jaeger.yaml"
        config.write_text(CONFIG.format(host=LOOPBACK, **self.ports))
        self.proc = procs.spawn(
            "jaeger",
            [str(binary), "--config", str(config)],
            run_dir=self.run_dir,
            log=self.run_dir / "jaeger.log",
        )
        procs.wait_until(self.proc, self._answers, timeout=60, what="its query API")
        return self

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.query}/api/services", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def services(self) -> list[str]:
        return list(httpx.get(f"{self.query}/api/services", timeout=10).json()["data"] or [])

    def trace(self, trace_id: str) -> list[JSON]:
        """The spans of one trace as Jaeger's query API gives them ([] while it has none)."""
        answer = httpx.get(f"{self.query}/api/traces/{trace_id}", timeout=10)
        if answer.status_code == 404:
            return []
        answer.raise_for_status()
        data = answer.json()["data"] or []
        return list(data[0]["spans"]) if data else []

    def answer(self, trace_id: str) -> JSON:
        """The query API's whole answer for one trace (what a trace UI draws)."""
        return dict(httpx.get(f"{self.query}/api/traces/{trace_id}", timeout=10).json())

    def wait_for(self, trace_id: str, ready: Any, timeout: float = 60) -> list[JSON]:
        """The trace's spans once ``ready(spans)`` says they are all in."""
        deadline = time.monotonic() + timeout
        spans: list[JSON] = []
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if spans and ready(spans):
                return spans
            time.sleep(0.5)
        raise AssertionError(f"trace {trace_id} not complete after {timeout}s: {len(spans)} spans")

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc, self.run_dir, grace=5)
            self.proc = None
