"""One pod's lifecycle on the node agent: run its containers as host processes, report status.

Why it exists: the kubelet is the only Kubernetes component the local cluster lacks. For each pod
bound to the node this worker sets up the pod's volumes (`keelgate_e2e.node.volumes`), runs the
init containers in order, then every container's command as a local process (the image is not
pulled: host programs run) in a mount namespace of its own, where the helper
`keelgate_e2e.node.mounts` has bound the volumes at their mountPaths; it restarts them per
`restartPolicy` with the kubelet's back-off, stops a pod past its `activeDeadlineSeconds` (Failed,
reason DeadlineExceeded), and reports status as the kubelet does: Pending,
Running, then Succeeded or Failed, with `containerStatuses`, exit codes and reasons (Completed,
Error, OOMKilled, StartError, CreateContainerConfigError). On graceful deletion it sends SIGTERM,
waits the grace period, sends SIGKILL, reports the final status and deletes the pod with grace 0.

It must never signal a process it did not start, never leave a process behind when the pod or the
agent goes away, and never change a pod bound to another node.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from keelgate_e2e.kube import JSON, STRATEGIC_PATCH, ApiError, Kube
from keelgate_e2e.node import env as envmod
from keelgate_e2e.node import volumes as volmod
from keelgate_e2e.node.cpu import CpuGroups
from keelgate_e2e.node.logs import pump, read_entries
from keelgate_e2e.procs import pids_with_env

log = logging.getLogger("keelgate_e2e.node.pod")

TERMINAL = ("Succeeded", "Failed")
#: Environment variable naming the container run a pod process belongs to.
CONTAINER_MARKER = "KEELGATE_E2E_CONTAINER"
#: Kubelet defaults: restart back-off doubles from the base up to five minutes.
MAX_BACKOFF = 300.0
#: How much of a failed container's log becomes its message (FallbackToLogsOnError).
MESSAGE_LINES = 80
MESSAGE_BYTES = 2048
#: Every container starts as this program, which mounts the pod's volumes in the container's own
#: mount namespace and then execs the container's command (see keelgate_e2e.node.mounts).
MOUNT_HELPER = Path(__file__).with_name("mounts.py")
#: How long the helper may take to mount and exec before the container counts as started.
EXEC_TIMEOUT = 30.0
#: Retry interval while a pod's volumes cannot be set up (the kubelet backs off similarly).
VOLUME_RETRY = 1.0


def _exec_status(fd: int, timeout: float) -> str:
    """Read the mount helper's status pipe until exec closes it (""), or its failure message.

    Closes `fd`. A helper still busy after `timeout` counts as started: its process is tracked
    and killed like any container's."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def now_iso() -> str:
    """Current time as a metav1.Time (seconds precision, UTC)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeContext:
    """What a pod worker needs from the agent."""

    kube: Kube
    node_name: str
    state_dir: Path
    node_ip: str
    allocatable: Mapping[str, str]
    service_env: Callable[[str], dict[str, str]]
    backoff_base: float = 10.0
    #: Variables every pod process carries (the run marker), so `make down` can find strays.
    marker_env: Mapping[str, str] = field(default_factory=dict)
    #: The pods' CPU weights (the kubelet's QoS cgroups), where the machine allows them.
    cpu: CpuGroups | None = None


def pid_file(state_dir: Path, uid: str, container: str) -> Path:
    """Where the agent records the pid (= process group) of a running container."""
    return state_dir / "pods" / uid / f"{container}.pid"


def oom_marker(state_dir: Path, uid: str, container: str) -> Path:
    """A file that makes the next exit of `container` report reason OOMKilled."""
    return state_dir / "pods" / uid / f"{container}.oom"


def kill_container(state_dir: Path, uid: str, container: str, *, oom: bool = False) -> int:
    """SIGKILL a running container's processes, as the kernel's OOM killer or a node fault would.

    With `oom`, the agent reports reason OOMKilled; otherwise Error. Returns the pid killed.
    """
    pid = int(pid_file(state_dir, uid, container).read_text())
    if oom:
        oom_marker(state_dir, uid, container).touch()
    os.killpg(pid, signal.SIGKILL)
    return pid


@dataclass
class Run:
    """One container of the pod and its current process, if any."""

    spec: JSON
    init: bool
    restart_count: int = 0
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: JSON = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    pumper: threading.Thread | None = None
    log: Path | None = None
    started_once: bool = False
    next_start: float = 0.0
    crashes: int = 0
    done: bool = False
    container_id: str = ""

    @property
    def name(self) -> str:
        """The container's name."""
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        """True while its process runs."""
        return self.popen is not None

    def exit_code(self) -> int | None:
        """The exit code of its last run, if it ended."""
        term = self.state.get("terminated")
        return None if term is None else int(term["exitCode"])


class PodWorker(threading.Thread):
    """Runs one pod (one uid) until it is deleted or the agent stops."""

    def __init__(self, ctx: NodeContext, pod: JSON) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.ctx = ctx
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.dir = ctx.state_dir / "pods" / self.uid
        self.volumes = volmod.PodVolumes(
            ctx.kube,
            self.dir / "volumes",
            ctx.allocatable,
            envmod.api_getter(ctx.kube.get, self.namespace),
        )
        self._volume_retry = 0.0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pod = pod
        self._delete_grace: float | None = None
        self._gone = False
        self._shutdown = False
        self._stopping = False  # set while terminating: exits are final, nothing restarts
        spec = pod["spec"]
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        self.init_runs = [Run(c, True) for c in spec.get("initContainers") or []]
        self.main_runs = [Run(c, False) for c in spec.get("containers") or []]
        for run in self.main_runs:
            if self.init_runs:
                run.state = {"waiting": {"reason": "PodInitializing"}}
        self.init_index = 0
        self.phase = "Pending"
        self.start_time = now_iso()
        self._active_since = time.monotonic()
        # The pod's own reason and message once it failed as a whole (DeadlineExceeded).
        self._failed_as: tuple[str, str] | None = None
        self._conditions: dict[str, tuple[str, str]] = {}  # type -> (status, transition time)
        self._last_sent: JSON | None = None
        # A status the API server did not take (it was down): sent again until it is, even once
        # the pod is terminal, as the kubelet's status manager does.
        self._unsent = False
        self.finished = threading.Event()

    # -- called by the agent (other threads) ------------------------------------------------

    def update(self, pod: JSON) -> None:
        """The pod changed in the API; notice a deletion request."""
        with self._lock:
            self._pod = pod
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") and self._delete_grace is None:
                self._delete_grace = float(meta.get("deletionGracePeriodSeconds", 30))
        self._wake.set()

    def gone(self) -> None:
        """The pod object is gone from the API (force-deleted or deleted by us)."""
        with self._lock:
            self._gone = True
        self._wake.set()

    def shutdown(self) -> None:
        """The agent is stopping: kill the processes, report nothing."""
        with self._lock:
            self._shutdown = True
        self._wake.set()

    def log_source(self, container: str, previous: bool) -> tuple[Path, bool] | str:
        """The log file of `container` (its previous run if asked) and whether it is written."""
        with self._lock:
            runs = [r for r in self.init_runs + self.main_runs if r.name == container]
            if not runs:
                return f'container "{container}" not found in pod "{self.pod_name}"'
            run = runs[0]
            index = run.restart_count - 1 if previous else run.restart_count
            if index < 0 or (previous and not run.started_once):
                return f'previous terminated container "{container}" not found'
            path = self.dir / container / f"{index}.log"
            writing = not previous and run.running
        if not path.exists():
            return f'container "{container}" in pod "{self.pod_name}" is waiting to start'
        return path, writing

    def is_writing(self, container: str) -> bool:
        """True while `container` has a running process (its log may grow)."""
        with self._lock:
            return any(r.running for r in self.init_runs + self.main_runs if r.name == container)

    # -- the worker thread --------------------------------------------------------------------

    def run(self) -> None:
        """Drive the pod until it is deleted or the agent stops."""
        try:
            self._loop()
        except Exception:
            log.exception("pod %s/%s: worker failed", self.namespace, self.pod_name)
        finally:
            self._kill_all(grace=0)
            self.finished.set()

    def _loop(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        pod = self._pod
        status: dict[str, Any] = pod.get("status") or {}
        if status.get("phase") in TERMINAL:
            self.phase = str(status["phase"])
            self._last_sent = {}  # never re-report a pod that was already terminal
        else:
            self._recover(status)
            self._report()
        while True:
            self._wake.clear()  # before reading the flags, so no wake-up is lost
            with self._lock:
                shutdown, gone, grace = self._shutdown, self._gone, self._delete_grace
            if shutdown:
                return
            if gone:
                self._kill_all(grace=2.0)
                return
            if grace is not None:
                self._terminate(grace)
                return
            if self.phase not in TERMINAL and self._past_deadline():
                self._expire()
            elif self.phase not in TERMINAL:
                self._step()
                self._report()
                self._resync_volumes()
            elif self._unsent:
                self._report()
            self._wake.wait(0.2 if self.phase not in TERMINAL else 5.0)

    def _past_deadline(self) -> bool:
        """Whether the pod has been active longer than its spec.activeDeadlineSeconds (counted,
        as the kubelet counts it, from when this node started it)."""
        deadline = self._pod.get("spec", {}).get("activeDeadlineSeconds")
        return deadline is not None and time.monotonic() - self._active_since >= float(deadline)

    def _expire(self) -> None:
        """The kubelet's active deadline: the pod fails as a whole (reason DeadlineExceeded),
        its containers are stopped with the pod's grace period (SIGTERM, then SIGKILL), and none
        restarts."""
        grace = float(self._pod.get("spec", {}).get("terminationGracePeriodSeconds", 30))
        self._kill_all(grace)
        with self._lock:
            for run in self.init_runs + self.main_runs:
                run.done = True
            self.phase = "Failed"
            self._failed_as = (
                "DeadlineExceeded",
                "Pod was active on the node longer than the specified deadline",
            )
        self._report()

    def _recover(self, status: JSON) -> None:
        """If the agent restarted, processes of this pod were lost: account for them."""
        previous = {c["name"]: c for c in status.get("containerStatuses") or []}
        started = [
            r
            for r in self.main_runs
            if previous.get(r.name, {}).get("state", {}).keys() & {"running", "terminated"}
        ]
        if not started:
            return
        self.init_index = len(self.init_runs)
        lost = {
            "exitCode": 137,
            "reason": "Error",
            "startedAt": self.start_time,
            "finishedAt": now_iso(),
            "message": "the node agent restarted; process lost",
        }
        for run in self.main_runs:
            prior = previous.get(run.name, {})
            run.restart_count = int(prior.get("restartCount", 0))
            run.started_once = run in started
            term = prior.get("state", {}).get("terminated")
            run.state = {"terminated": term or lost}
            if self.restart_policy == "Never" or (
                self.restart_policy == "OnFailure" and term and term.get("exitCode") == 0
            ):
                run.done = True
        self._settle_phase()

    # -- running containers ---------------------------------------------------------------------

    def _step(self) -> None:
        now = time.monotonic()
        if not self.volumes.ready and not self._setup_volumes(now):
            return
        if self.init_index < len(self.init_runs):
            run = self.init_runs[self.init_index]
            self._advance(run, now)
            if run.done:
                if run.exit_code() == 0:
                    self.init_index += 1
                    if self.init_index == len(self.init_runs):
                        for main in self.main_runs:
                            main.state = {"waiting": {"reason": "ContainerCreating"}}
                else:
                    self.phase = "Failed"  # an init container failed and will not be retried
            return
        for run in self.main_runs:
            self._advance(run, now)
        self._settle_phase()

    def _setup_volumes(self, now: float) -> bool:
        """Set up the pod's volumes before its first container starts, as the kubelet does;
        until they are, containers wait in ContainerCreating (retried every second)."""
        if now < self._volume_retry:
            return False
        try:
            self.volumes.sync(self._pod)
        except (volmod.VolumeError, ApiError, httpx.HTTPError, OSError) as exc:
            self._volume_retry = now + VOLUME_RETRY
            with self._lock:
                for run in self.init_runs + self.main_runs:
                    if run.state.get("waiting", {}).get("reason") == "ContainerCreating":
                        run.state = {
                            "waiting": {"reason": "ContainerCreating", "message": str(exc)}
                        }
            return False
        with self._lock:
            for run in self.init_runs + self.main_runs:
                if run.state.get("waiting", {}).get("reason") == "ContainerCreating":
                    run.state = {"waiting": {"reason": "ContainerCreating"}}
        return True

    def _resync_volumes(self) -> None:
        """Bring Secret, ConfigMap and downward-API files up to date and refresh tokens before
        they expire (every minute, sooner when a token is due); on failure keep the old files."""
        if not self.volumes.ready or time.monotonic() < self.volumes.next_resync:
            return
        try:
            self.volumes.sync(self._pod)
        except (volmod.VolumeError, ApiError, httpx.HTTPError, OSError) as exc:
            log.warning("pod %s/%s: volume resync failed: %s", self.namespace, self.pod_name, exc)
            self.volumes.next_resync = time.monotonic() + 10.0

    def _advance(self, run: Run, now: float) -> None:
        if run.popen is not None:
            code = run.popen.poll()
            if code is not None:
                self._exited(run, code)
        if run.popen is None and not run.done and now >= run.next_start:
            self._start(run)

    def _settle_phase(self) -> None:
        runs = self.main_runs
        if any(r.running for r in runs):
            self.phase = "Running"
        elif runs and all(r.done for r in runs):
            self.phase = "Succeeded" if all(r.exit_code() == 0 for r in runs) else "Failed"
        elif any(r.started_once for r in runs):
            self.phase = "Running"  # restarting after an exit, as the kubelet reports it

    def _start(self, run: Run) -> None:
        pod = self._pod
        getter = envmod.api_getter(self.ctx.kube.get, self.namespace)
        try:
            env = envmod.build_env(
                pod,
                run.spec,
                getter,
                service_env=self.ctx.service_env(self.namespace),
                node_allocatable=self.ctx.allocatable,
            )
            argv = envmod.command_line(run.spec, env)
            mounts = self.volumes.mounts(pod, run.spec, env)
        except (envmod.ConfigError, volmod.VolumeError, ApiError, httpx.HTTPError) as exc:
            reason = "CreateContainerConfigError"
            if isinstance(exc, envmod.ConfigError) and "no command" in str(exc):
                reason = "CreateContainerError"
            with self._lock:
                run.state = {"waiting": {"reason": reason, "message": str(exc)}}
            run.next_start = time.monotonic() + 2.0
            return
        env.update(self.ctx.marker_env)
        restart_count = run.restart_count + 1 if run.started_once else run.restart_count
        container_id = f"keelgate-node://{self.uid}/{run.name}/{restart_count}"
        env[CONTAINER_MARKER] = container_id  # finds processes that left the process group
        # Without workingDir a container starts in a private directory of its own; with it, the
        # helper changes there after mounting (it may lie inside a volume).
        private = self.dir / run.name / "root"
        private.mkdir(parents=True, exist_ok=True)
        group = None if self.ctx.cpu is None else self.ctx.cpu.group_for(self._pod)
        spec = volmod.helper_spec(
            mounts, volmod.masks(mounts), run.spec.get("workingDir"), cgroup=group
        )
        logfile = self.dir / run.name / f"{restart_count}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        logfile.touch()
        started = now_iso()
        status_read, status_write = os.pipe()
        try:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    str(MOUNT_HELPER),
                    str(status_write),
                    spec,
                    "--",
                    *argv,
                ],
                cwd=private,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(status_write,),
            )
        except OSError as exc:
            os.close(status_read)
            self._record_start(run, restart_count, logfile, None, started)
            self._finish(run, 128, "StartError", f"failed to start {argv[0]!r}: {exc}")
            return
        finally:
            os.close(status_write)
        assert popen.stdout is not None
        pumper = threading.Thread(
            target=pump, args=(popen.stdout, logfile), name=f"log-{run.name}", daemon=True
        )
        pumper.start()
        failure = _exec_status(status_read, EXEC_TIMEOUT)
        if failure:
            # The helper could not mount or exec: the container never started (StartError).
            # It exits at once; kill it only while unreaped, so the group is surely ours.
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
            pumper.join(timeout=2.0)
            self._record_start(run, restart_count, logfile, None, started)
            self._finish(run, 128, "StartError", failure)
            return
        pid_file(self.ctx.state_dir, self.uid, run.name).write_text(str(popen.pid))
        self._record_start(run, restart_count, logfile, popen, started)
        run.pumper = pumper
        run.container_id = container_id

    def _record_start(
        self,
        run: Run,
        restart_count: int,
        logfile: Path,
        popen: subprocess.Popen[bytes] | None,
        started: str,
    ) -> None:
        with self._lock:
            if run.started_once and "terminated" in run.state:
                run.last_state = {"terminated": run.state["terminated"]}
            elif run.started_once and run.last_state.get("terminated"):
                pass  # keep the last termination while waiting in back-off
            run.restart_count = restart_count
            run.started_once = True
            run.log = logfile
            run.popen = popen
            if popen is not None:
                run.state = {"running": {"startedAt": started}}
            else:
                run.state = {"terminated": {"startedAt": started}}

    def _exited(self, run: Run, returncode: int) -> None:
        assert run.popen is not None
        code = 128 - returncode if returncode < 0 else returncode
        # When a container's main process ends, its other processes die with it (as they do
        # in a container's PID namespace): its process group, and any that left the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.popen.pid, signal.SIGKILL)
        strays = pids_with_env(CONTAINER_MARKER, run.container_id) if run.container_id else []
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if run.pumper is not None:
            run.pumper.join(timeout=2.0)
        marker = oom_marker(self.ctx.state_dir, self.uid, run.name)
        if marker.exists():
            reason = "OOMKilled"
            marker.unlink()
        else:
            reason = "Completed" if code == 0 else "Error"
        message = ""
        if code != 0 and run.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = self._log_tail(run)
        with contextlib.suppress(FileNotFoundError):
            pid_file(self.ctx.state_dir, self.uid, run.name).unlink()
        with self._lock:
            run.popen = None
            run.pumper = None
        self._finish(run, code, reason, message)

    def _finish(self, run: Run, code: int, reason: str, message: str) -> None:
        current: JSON = run.state.get("running") or run.state.get("terminated") or {}
        started = current.get("startedAt")
        term: JSON = {
            "exitCode": code,
            "reason": reason,
            "startedAt": started or now_iso(),
            "finishedAt": now_iso(),
        }
        if message:
            term["message"] = message
        if run.container_id:
            term["containerID"] = run.container_id
        restart = not run.init and (
            self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0)
        )
        restart = restart or (run.init and code != 0 and self.restart_policy != "Never")
        restart = restart and not self._stopping
        with self._lock:
            run.state = {"terminated": term}
            if restart:
                delay = (
                    0.0
                    if run.crashes == 0
                    else min(MAX_BACKOFF, self.ctx.backoff_base * 2 ** (run.crashes - 1))
                )
                run.crashes += 1
                run.next_start = time.monotonic() + delay
                if delay > 0:
                    run.last_state = {"terminated": term}
                    run.state = {
                        "waiting": {
                            "reason": "CrashLoopBackOff",
                            "message": f"back-off {delay:.0f}s restarting failed container="
                            f"{run.name} pod={self.pod_name}_{self.namespace}({self.uid})",
                        }
                    }
            else:
                run.done = True

    def _log_tail(self, run: Run) -> str:
        if run.log is None:
            return ""
        entries, _ = read_entries(run.log)
        text = b"".join(e.text + (b"" if e.partial else b"\n") for e in entries[-MESSAGE_LINES:])
        return text[-MESSAGE_BYTES:].decode(errors="replace")

    # -- stopping -------------------------------------------------------------------------------

    def _kill_all(self, grace: float) -> None:
        """SIGTERM every running process group, wait up to `grace` s, SIGKILL what is left."""
        self._stopping = True
        runs = [r for r in self.init_runs + self.main_runs if r.popen is not None]
        for run in runs:
            assert run.popen is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(
            r.popen is not None and r.popen.poll() is None for r in runs
        ):
            with self._lock:
                if self._gone and grace > 2.0:
                    deadline = min(deadline, time.monotonic() + 2.0)  # force-deleted meanwhile
                if self._shutdown:
                    deadline = time.monotonic()  # the agent is stopping: no more waiting
            time.sleep(0.05)
        for run in runs:
            assert run.popen is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.popen.pid, signal.SIGKILL)
            run.popen.wait()
            self._exited(run, run.popen.returncode)

    def _terminate(self, grace: float) -> None:
        """Graceful deletion: stop the containers, report the final status, delete the pod."""
        if self.phase not in TERMINAL:
            self._kill_all(grace)
            for run in self.init_runs[self.init_index :] + self.main_runs:
                if not run.started_once:
                    run.state = {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "ContainerStatusUnknown",
                            "message": "The container could not be located when the pod "
                            "was deleted.  The container used to be Running",
                            "startedAt": self.start_time,
                            "finishedAt": now_iso(),
                        }
                    }
                run.done = True
            codes = [r.exit_code() for r in self.main_runs]
            self.phase = "Succeeded" if codes and all(c == 0 for c in codes) else "Failed"
            self._report()
        body: JSON = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}"
        for attempt in range(10):
            try:
                self.ctx.kube.delete(path, body)
                return
            except ApiError as exc:
                if exc.status in (404, 409):
                    return  # already gone, or the name now belongs to a new pod
                log.warning("pod %s/%s: delete failed: %s", self.namespace, self.pod_name, exc)
            except httpx.HTTPError as exc:
                log.warning("pod %s/%s: delete failed: %s", self.namespace, self.pod_name, exc)
            time.sleep(min(5.0, 0.2 * 2**attempt))

    # -- status -------------------------------------------------------------------------------

    def _condition(self, ctype: str, status: str, reason: str = "", message: str = "") -> JSON:
        previous = self._conditions.get(ctype)
        if previous is None or previous[0] != status:
            self._conditions[ctype] = (status, now_iso())
        cond: JSON = {
            "type": ctype,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self._conditions[ctype][1],
        }
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        return cond

    def _container_status(self, run: Run) -> JSON:
        running = "running" in run.state
        # Readiness probes are not run: a running container is ready; a finished init container
        # is ready when it succeeded.
        ready = (run.exit_code() == 0 and run.done) if run.init else running
        status: JSON = {
            "name": run.name,
            "image": run.spec.get("image", ""),
            "imageID": "",
            "ready": ready,
            "restartCount": run.restart_count,
            "started": running,
            "state": run.state,
            "lastState": run.last_state,
        }
        if run.container_id:
            status["containerID"] = run.container_id
        return status

    def build_status(self) -> JSON:
        """The pod status the kubelet would report now."""
        with self._lock:
            terminal = self.phase in TERMINAL
            initialized = self.init_index >= len(self.init_runs)
            pending_init = [r.name for r in self.init_runs[self.init_index :]]
            unready = [r.name for r in self.main_runs if "running" not in r.state]
            conditions = [
                self._condition("PodReadyToStartContainers", "False" if terminal else "True"),
                self._condition(
                    "Initialized",
                    "True" if initialized else "False",
                    "" if initialized else "ContainersNotInitialized",
                    "" if initialized else f"containers with incomplete status: {pending_init}",
                ),
            ]
            for ctype in ("ContainersReady", "Ready"):
                if terminal:
                    conditions.append(self._condition(ctype, "False", "PodCompleted"))
                elif unready:
                    conditions.append(
                        self._condition(
                            ctype,
                            "False",
                            "ContainersNotReady",
                            f"containers with unready status: [{' '.join(unready)}]",
                        )
                    )
                else:
                    conditions.append(self._condition(ctype, "True"))
            conditions.append(self._condition("PodScheduled", "True"))
            ip = self.ctx.node_ip
            status: JSON = {
                "phase": self.phase,
                "conditions": conditions,
                "hostIP": ip,
                "hostIPs": [{"ip": ip}],
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": self.start_time,
                "containerStatuses": [self._container_status(r) for r in self.main_runs],
            }
            if self._failed_as is not None:
                status["reason"], status["message"] = self._failed_as
            if self.init_runs:
                status["initContainerStatuses"] = [
                    self._container_status(r) for r in self.init_runs
                ]
        return status

    def _report(self) -> None:
        status = self.build_status()
        if status == self._last_sent:
            return
        patch: JSON = {"metadata": {"uid": self.uid}, "status": status}
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}/status"
        try:
            self.ctx.kube.patch(path, patch, content_type=STRATEGIC_PATCH)
        except ApiError as exc:
            if exc.status in (404, 409):
                with self._lock:
                    self._gone = True  # deleted, or replaced by a pod of another uid
                return
            log.warning("pod %s/%s: status update failed: %s", self.namespace, self.pod_name, exc)
            self._unsent = True  # retried on the next pass, since _last_sent is unchanged
            return
        except httpx.HTTPError as exc:
            log.warning("pod %s/%s: status update failed: %s", self.namespace, self.pod_name, exc)
            self._unsent = True
            return
        self._last_sent = status
        self._unsent = False
