"""The hollow step executor: the real ``keelgate step`` of each step pod kwok shows running, in a
bounded pool of processes, and the pod's end reported as a kubelet reports it.

Why it exists: kwok's nodes run nothing, and a step pod's work is the point (its checkpoints,
its claim, its WRITE to the shop, every commit in PostgreSQL). For each step pod that kwok has
made Running, this executor does what a kubelet would do with the container: it resolves the
container's environment from the pod spec (``KEELGATE_STORE`` from the Secret it names),
starts ``keelgate step`` with the container's arguments as a process of its own, keeps its
output as the container's log, and when it exits writes the pod's status through
``pods/status``: phase Succeeded or Failed, the container ``terminated`` with its exit code,
reason (Completed or Error), start and finish times and the termination message (the log's
tail when the step failed and wrote none, as ``FallbackToLogsOnError`` says).

Only the container is hollow: each step runs in a process forked from one that has imported
Keelgate already (multiprocessing's forkserver), so the bench does not pay a Python start per
step, which a real node pays on its own cores, not the control plane's. At most ``parallel``
steps run at once; the others wait as Running pods, and the next to run is drawn at random
among them: steps of real runs take varied times (a model's answer, a tool), so runs drift
apart and the cluster holds a mix of first, middle and last steps rather than every run moving
in lockstep. A pod deleted while its step runs has its process killed (SIGKILL), as a node lost
would.

Run as ``python -m scalebench.executor --kubeconfig K --work DIR --parallel N``; SIGTERM stops
it (steps under way are killed) and it writes its counts to ``DIR/executor.json``. It must never
write a pod's spec, and never report an end for a pod whose step it did not run.
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from keelgate_e2e.kube import ApiError, Kube

from scalebench.watch import STEP_SELECTOR, Watch

JSON = dict[str, Any]
#: What the forkserver imports once, so each step's process starts with them loaded.
PRELOAD = [
    "keelgate.cli.step",
    "keelgate.runners.step",
    "keelgate.runners.build",
    "keelgate.stores.postgres",
    "keelgate.core.loop",
    "keelgate.adapters.tools.http",
    "keelgate.adapters.models.scripted",
    "psycopg",
    "httpx",
    # What a step's HTTP tool imports on its first call (httpcore, and through its backends
    # anyio and trio): a tenth of a second of each step's CPU when left to the child.
    "httpcore",
    "h11",
    "anyio",
    "sniffio",
    "certifi",
    "trio",
    "pydantic.dataclasses",
    "stringprep",
    "encodings.idna",
    "scalebench.step_child",
    "scalebench.frozen",  # last: what the preload made, set aside from the collector
]
TAIL_BYTES = 4096


def rfc3339(at: float) -> str:
    """A time as the API server writes it (RFC 3339, UTC, whole seconds)."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Step:
    """One step pod to run: where it is, what its container is, and when it began."""

    namespace: str
    name: str
    uid: str
    image: str
    argv: list[str]
    env: dict[str, str]
    started_at: str  # the container's running.startedAt (kwok's)
    conditions: list[JSON]
    seen: float = field(default_factory=time.monotonic)  # running first seen
    begun: float = 0.0
    proc: BaseProcess | None = None
    killed: bool = False


class Counts:
    """What the executor did (written to executor.json at the end)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.exits: collections.Counter[str] = collections.Counter()
        self.waits: list[float] = []  # Running seen -> process started
        self.spans: list[float] = []  # process started -> exited
        self.patch_failures = 0
        self.killed = 0

    def to_json(self) -> JSON:
        with self.lock:
            return {
                "steps": sum(self.exits.values()),
                "exit_codes": dict(self.exits),
                "killed": self.killed,
                "patch_failures": self.patch_failures,
                "waits": self.waits[-50000:],
                "spans": self.spans[-50000:],
            }


class Executor:
    def __init__(self, kube: Kube, *, work: Path, parallel: int, context: ForkServerContext):
        self.kube = kube
        self.work = work
        self.parallel = parallel
        self.context = context
        self.counts = Counts()
        self.lock = threading.Lock()
        self.ready: list[Step] = []
        self.draw = random.Random(40)
        self.running: dict[str, Step] = {}  # uid -> step
        self.known: set[str] = set()  # uids taken (run, running or done): each once
        self.deleted: set[str] = set()
        self.secrets: dict[tuple[str, str], JSON] = {}
        self.stop = threading.Event()
        self.wake = threading.Event()
        self.patches = ThreadPoolExecutor(4, thread_name_prefix="patch")

    # The step pods (seen through a ``Watch``)

    def seen(self, pod: JSON, *, deleted: bool) -> None:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        uid = str(meta.get("uid", ""))
        if deleted:
            with self.lock:
                self.deleted.add(uid)
                step = self.running.get(uid)
                if step is not None and step.proc is not None:
                    step.killed = True
                    with contextlib.suppress(Exception):
                        step.proc.kill()
            return
        if uid in self.known or status.get("phase") != "Running" or meta.get("deletionTimestamp"):
            return
        containers = status.get("containerStatuses") or []
        running = (containers[0].get("state") or {}).get("running") if containers else None
        if not running:
            return
        spec = pod["spec"]["containers"][0]
        try:
            env = self.environment(meta["namespace"], spec.get("env") or [])
        except Exception as error:  # a kubelet would report CreateContainerConfigError
            print(f"executor: {meta['name']}: {error}", flush=True)
            return
        step = Step(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=uid,
            image=str(spec.get("image", "")),
            argv=[*(spec.get("command") or []), *(spec.get("args") or [])],
            env=env,
            started_at=str(running.get("startedAt") or rfc3339(time.time())),
            conditions=list(status.get("conditions") or []),
        )
        with self.lock:
            self.known.add(uid)
            self.ready.append(step)
        self.wake.set()

    def environment(self, namespace: str, env: list[JSON]) -> dict[str, str]:
        """The container's variables, Secret references read as a kubelet reads them."""
        out: dict[str, str] = {}
        for item in env:
            if "value" in item:
                out[item["name"]] = str(item["value"])
                continue
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if not ref:
                continue
            key = (namespace, str(ref["name"]))
            secret = self.secrets.get(key)
            if secret is None:
                try:
                    secret = self.kube.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
                except ApiError as error:
                    if error.status == 404 and ref.get("optional"):
                        continue
                    raise
                self.secrets[key] = secret
            data = secret.get("data") or {}
            if ref["key"] in data:
                out[item["name"]] = base64.b64decode(data[ref["key"]]).decode()
            elif not ref.get("optional"):
                raise KeyError(f"secret {ref['name']} has no key {ref['key']}")
        return out

    # Running the steps

    def run(self) -> None:
        """Start steps while there is room; collect those that ended."""
        from scalebench.step_child import main as child_main

        while not self.stop.is_set():
            with self.lock:
                while self.ready and len(self.running) < self.parallel:
                    index = self.draw.randrange(len(self.ready))
                    self.ready[index], self.ready[-1] = self.ready[-1], self.ready[index]
                    step = self.ready.pop()
                    if step.uid in self.deleted:
                        continue
                    log = self.work / "logs" / f"{step.uid}.log"
                    tlog = self.work / "logs" / f"{step.uid}.term"
                    tlog.write_bytes(b"")
                    argv = [*step.argv[2:], "--termination-log", str(tlog)]  # after "keelgate step"
                    proc = self.context.Process(
                        target=child_main, args=(argv, step.env, str(log)), daemon=True
                    )
                    step.begun = time.monotonic()
                    proc.start()
                    step.proc = proc
                    self.running[step.uid] = step
                sentinels = {
                    s.proc.sentinel: s for s in self.running.values() if s.proc is not None
                }
            if not sentinels:
                self.wake.wait(0.2)
                self.wake.clear()
                continue
            done = multiprocessing.connection.wait(list(sentinels), timeout=0.05)
            for sentinel in done:
                step = sentinels[sentinel]  # type: ignore[index]
                assert step.proc is not None
                step.proc.join()
                code = step.proc.exitcode
                ended = time.monotonic()
                with self.lock:
                    self.running.pop(step.uid, None)
                with self.counts.lock:
                    self.counts.waits.append(step.begun - step.seen)
                    self.counts.spans.append(ended - step.begun)
                if step.killed or code is None or code < 0:
                    with self.counts.lock:
                        self.counts.killed += 1
                    continue
                with self.counts.lock:
                    self.counts.exits[str(code)] += 1
                self.patches.submit(self.report, step, code, time.time())

    def report(self, step: Step, code: int, finished: float) -> None:
        """The container ended: the pod's status, as a kubelet writes it."""
        log = self.work / "logs" / f"{step.uid}.log"
        tlog = self.work / "logs" / f"{step.uid}.term"
        message = (
            tlog.read_bytes()[-TAIL_BYTES:].decode("utf-8", "replace") if tlog.exists() else ""
        )
        if code != 0 and not message.strip() and log.exists():
            message = log.read_bytes()[-TAIL_BYTES:].decode("utf-8", "replace")
        if os.environ.get("SCALEBENCH_IMPORTS") and log.exists():
            print(log.read_text()[-3000:], flush=True)
        for path in (log, tlog):
            path.unlink(missing_ok=True)
        stamp = rfc3339(finished)
        conditions = []
        for condition in step.conditions:
            if condition.get("type") in ("Ready", "ContainersReady"):
                condition = {
                    **condition,
                    "status": "False",
                    "reason": "PodCompleted",
                    "lastTransitionTime": stamp,
                }
            conditions.append(condition)
        terminated: JSON = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": step.started_at,
            "finishedAt": stamp,
            "containerID": f"hollow://{step.uid}",
        }
        if message:
            terminated["message"] = message
        body = {
            "status": {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": conditions,
                "containerStatuses": [
                    {
                        "name": "step",
                        "image": step.image,
                        "imageID": "",
                        "containerID": f"hollow://{step.uid}",
                        "ready": False,
                        "started": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        }
        try:
            self.kube.patch(f"/api/v1/namespaces/{step.namespace}/pods/{step.name}/status", body)
        except ApiError as error:
            if error.status != 404:  # a pod deleted meanwhile has no status to write
                with self.counts.lock:
                    self.counts.patch_failures += 1
                print(f"executor: status of {step.name}: {error}", flush=True)

    def kill_all(self) -> None:
        with self.lock:
            for step in self.running.values():
                if step.proc is not None:
                    with contextlib.suppress(Exception):
                        step.proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalebench.executor")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--parallel", type=int, default=16)
    args = parser.parse_args(argv)
    (args.work / "logs").mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("forkserver")
    assert isinstance(context, ForkServerContext)
    context.set_forkserver_preload(PRELOAD)
    kube = Kube.from_kubeconfig(args.kubeconfig, context="admin")
    executor = Executor(kube, work=args.work, parallel=args.parallel, context=context)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    pods = Watch(
        kube,
        "/api/v1/pods",
        {"labelSelector": STEP_SELECTOR},
        lambda pod, gone: executor.seen(pod, deleted=gone),
    ).start()
    runner = threading.Thread(target=executor.run, daemon=True, name="run")
    runner.start()
    print(f"executor: started, at most {args.parallel} steps at once", flush=True)
    try:
        while not stopped.wait(1.0):
            (args.work / "executor.json.tmp").write_text(json.dumps(executor.counts.to_json()))
            os.replace(args.work / "executor.json.tmp", args.work / "executor.json")
    finally:
        pods.stop.set()
        executor.stop.set()
        executor.kill_all()
        runner.join(timeout=10)
        executor.patches.shutdown(wait=True, cancel_futures=True)
        (args.work / "executor.json").write_text(json.dumps(executor.counts.to_json()))
        print(f"executor: stopped after {sum(executor.counts.exits.values())} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
