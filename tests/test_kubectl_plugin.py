"""`kubectl keelgate` without a cluster: kubectl's flags and KUBECONFIG resolved as kubectl does,
bad input refused before any request, decisions patched only in the user's own name and only
when the API server says they may, the same exit codes and one-line errors as `keelgate`, and
nothing secret in any output. The commands run against a fake cluster (``FakeCluster``); the
real API server is exercised in e2e/tests/test_e2e_plugin.py."""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import yaml

from keelgate.cli.listing import age, span
from keelgate.cli.plugin import commands, main
from keelgate.cli.plugin.client import NotFound, Refused
from keelgate.cli.plugin.commands import APPROVAL, decide
from keelgate.cli.plugin.listing import expires_in
from keelgate.cli.plugin.target import Target, resolve
from keelgate.errors import InputError, SettleError
from keelgate.kube.naming import action_object_name
from keelgate.kube.times import parse_time, stamp

JSON = dict[str, Any]
TOKEN = "tok-never-shown-5521"
STORE_PASSWORD = "pw-never-shown-9917"


def kubeconfig(path: Path, *, server: str = "https://127.0.0.1:6443", **contexts: Any) -> Path:
    """A kubeconfig with one cluster and one token user; ``contexts`` maps a context's name to
    its namespace (None: no namespace); the first is current unless ``current`` says."""
    current = contexts.pop("current", None)
    names = list(contexts)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [
            {
                "name": n,
                "context": {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})},
            }
            for n, ns in contexts.items()
        ],
    }
    if current is not False and names:
        config["current-context"] = current or names[0]
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """KUBECONFIG names a file whose current context `alice` is set to namespace `shop`."""
    path = kubeconfig(tmp_path / "config", alice="shop", bob=None)
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KEELGATE_STORE", raising=False)
    return path


# The fake cluster


def run_body(name: str = "restock", **status: Any) -> JSON:
    return {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": "shop", "generation": 1},
        "spec": {"goal": "g", "budget": {"maxIterations": 5, "tokens": 2000}},
        "status": status,
    }


def decision(kind: str, run: str, action: str, tool: str = "place_order", **spec: Any) -> JSON:
    iteration, _, index = action.partition(":")
    middle = iteration if index == "0" else f"{iteration}-{index}"
    return {
        "kind": kind,
        "metadata": {"name": f"{run}-{middle}-{tool.replace('_', '-')}", "namespace": "shop"},
        "spec": {"runName": run, "action": action, "tool": tool, **spec},
        "status": {"phase": "Pending"},
    }


def step_pod(run: str, step: int, attempt: int, *, exit_code: int | None = 0) -> JSON:
    state: JSON = (
        {"terminated": {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed"}}
        if exit_code is not None
        else {"running": {}}
    )
    return {
        "metadata": {
            "name": f"{run}-s{step}-a{attempt}",
            "labels": {"keelgate.dev/step": str(step), "keelgate.dev/attempt": str(attempt)},
        },
        "status": {
            "phase": "Running" if exit_code is None else "Failed",
            "containerStatuses": [{"name": "step", "state": state}],
        },
    }


@dataclass
class FakeCluster:
    """The API server as the plugin sees it: objects by kind, an access verdict, a user."""

    target: Target = field(default_factory=lambda: Target("", "alice", "shop"))
    user: str = "alice"
    groups: tuple[str, ...] = ("system:authenticated",)
    allowed: bool = True
    #: Where RBAC lets the user patch, as an access review for that namespace would say: None,
    #: wherever ``allowed`` says; else these namespaces only (a review naming none asks about
    #: the target's).
    patchable: tuple[str, ...] | None = None
    runs: dict[str, JSON] = field(default_factory=dict)
    objects: dict[str, list[JSON]] = field(
        default_factory=lambda: {"Reconciliation": [], "Approval": []}
    )
    pods: list[JSON] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    patches: list[tuple[str, str, JSON]] = field(default_factory=list)
    #: The moments decisions on Reconciliations said they were made (``decidedAt``), in order.
    stated: list[str] = field(default_factory=list)
    asked: list[tuple[str, str, str]] = field(default_factory=list)
    #: Where the user may list, as RBAC would say: None, everywhere (cluster-wide too); else
    #: these namespaces only (each list elsewhere, and cluster-wide, is forbidden), and the
    #: objects are where their metadata says.
    listable: tuple[str, ...] | None = None
    #: The cluster's namespaces, when the user may list them (None: forbidden, as for most).
    namespace_names: list[str] | None = None

    def whoami(self) -> str:
        return self.user

    def identity(self) -> tuple[str, tuple[str, ...]]:
        return self.user, self.groups

    def append_decision(self, name: str, entry: Mapping[str, Any], *, first: bool) -> JSON:
        """A JSON patch adding ``entry`` to the Approval's decisions (``first``: making the
        list), applied to the object as the API server would. The moment the client states
        (``at``) must be now, to the second; it is kept out of ``patches``, which tests compare
        whole."""
        stated = parse_time(str(entry.get("at")))
        assert stated is not None and abs(dt.datetime.now(dt.UTC) - stated).total_seconds() < 60
        said = {k: v for k, v in entry.items() if k != "at"}
        self.patches.append(("Approval", name, {"decisions+": said, "first": first}))
        found = next(o for o in self.objects["Approval"] if o["metadata"]["name"] == name)
        assert first == ("decisions" not in found["spec"])
        found["spec"].setdefault("decisions", []).append(dict(entry))
        return found

    def may(
        self, verb: str, resource: str, name: str, *, namespace: str | None = None
    ) -> tuple[bool, str]:
        self.asked.append((verb, resource, name))
        where = self.target.namespace if namespace is None else namespace
        allowed = self.allowed and (self.patchable is None or where in self.patchable)
        return allowed, "" if allowed else "no RBAC policy matched"

    def agentrun(self, name: str) -> JSON:
        if name not in self.runs:
            raise InputError("RUN", f"no AgentRun named {name!r} in namespace 'shop'")
        return self.runs[name]

    def decisions(self, kind: str, run: str) -> list[JSON]:
        return [o for o in self.objects[kind] if o["spec"]["runName"] == run]

    def patch_spec(self, kind: str, name: str, spec: Mapping[str, Any]) -> JSON:
        """A merge patch of the object's spec. A decision on a Reconciliation states when it
        was made (``decidedAt``): it must be now, to the second, in UTC; it is kept in
        ``stated`` and out of ``patches``, which tests compare whole."""
        said = dict(spec)
        if kind == "Reconciliation":
            stated = str(said.pop("decidedAt", ""))
            assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z", stated)
            moment = parse_time(stated)
            assert moment is not None
            assert 0 <= (dt.datetime.now(dt.UTC) - moment).total_seconds() < 60, stated
            self.stated.append(stated)
        self.patches.append((kind, name, said))
        return {}

    def pod(self, name: str) -> JSON | None:
        return next((p for p in self.pods if p["metadata"]["name"] == name), None)

    def step_pods(self, run: str) -> list[JSON]:
        return list(self.pods)

    def listed(self, kind: str, *, all_namespaces: bool = False, namespace: str = "") -> list[JSON]:
        where = "all" if all_namespaces else namespace or self.target.namespace
        self.asked.append(("list", kind, where))
        found = list(self.runs.values()) if kind == "AgentRun" else list(self.objects[kind])
        if self.listable is None:
            return found
        if where not in self.listable:
            scope = "at the cluster scope" if all_namespaces else f'in the namespace "{where}"'
            raise Refused(
                f'{kind.lower()}s.keelgate.dev is forbidden: User "{self.user}" cannot list '
                f'resource "{kind.lower()}s" in API group "keelgate.dev" {scope}',
                status=403,
            )
        return [o for o in found if o["metadata"].get("namespace") == where]

    def namespaces(self) -> list[str]:
        self.asked.append(("list", "Namespace", "all"))
        if self.namespace_names is None:
            raise Refused('namespaces is forbidden: User "alice" cannot list', status=403)
        return list(self.namespace_names)

    def pod_log(self, name: str, *, tail: int | None = None, since: int | None = None) -> str:
        if name not in self.logs:
            raise Refused(f"log of pod {name}: the node is gone", status=500)
        self.asked.append(("log", name, f"tail={tail} since={since}"))
        lines = self.logs[name].splitlines(keepends=True)
        return "".join(lines if tail is None else lines[-tail:] if tail else [])

    def follow_log(self, name: str, *, tail: int | None = None) -> Iterator[str]:
        """The running pod's log as written; once read to its end, the pod has ended."""
        yield from self.logs[name].splitlines()
        for pod in self.pods:
            if pod["metadata"]["name"] == name:
                pod["status"] = step_pod("x", 1, 1, exit_code=0)["status"]


@pytest.fixture
def cluster(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    fake = FakeCluster()
    seen: list[Target] = []

    def connect(target: Target) -> FakeCluster:
        seen.append(target)
        fake.target = target
        return fake

    monkeypatch.setattr(commands, "connect", connect)
    yield fake


@pytest.fixture
def no_cluster(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that must be refused before it contacts anything."""

    def connect(target: Target) -> FakeCluster:
        raise AssertionError("the cluster was contacted")

    monkeypatch.setattr(commands, "connect", connect)


def plugin(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# Installation and kubectl's flags


def test_the_package_installs_a_kubectl_keelgate_executable() -> None:
    """`[project.scripts]` names kubectl-keelgate, which kubectl finds on PATH as a plugin."""
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("kubectl-keelgate") == "keelgate.cli.plugin:run"


def test_help_does_without_the_manifest_models() -> None:
    """`kubectl keelgate --help` (and so every command that does not approve) never loads
    keelgate.manifest, whose pydantic models take tens of milliseconds to import: only the
    approval rule's check needs the run's creator, and it reads it there."""
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from keelgate.cli.plugin import main\n"
            "code = main(['--help'])\n"
            "print(code, sorted(m for m in sys.modules if m.startswith('keelgate.manifest')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip().splitlines()[-1] == "0 []", shown.stdout + shown.stderr


def test_the_context_and_its_namespace_come_from_kubeconfig_like_kubectl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KUBECONFIG's files are merged (the first file's current context wins), the context's
    namespace is used when -n is not given, -n wins over it, `default` when neither says, and
    --kubeconfig wins over KUBECONFIG."""
    first = kubeconfig(tmp_path / "a", alice="shop")
    second = kubeconfig(tmp_path / "b", bob=None, current=False)
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    assert resolve(None, None, None) == Target(f"{first}:{second}", "alice", "shop")
    bob = resolve(None, "bob", None)
    assert (bob.context, bob.namespace, bob.context_given) == ("bob", "default", True)
    given = resolve(None, None, "other")
    assert (given.namespace, given.namespace_given) == ("other", True)
    explicit = kubeconfig(tmp_path / "c", carol="ops")
    chosen = resolve(str(explicit), None, None)
    assert (chosen.config_files, chosen.context, chosen.namespace) == (
        str(explicit),
        "carol",
        "ops",
    )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--context", "nope"], "--context: no context 'nope'"),
        (["--kubeconfig", "/no/such/file"], "--kubeconfig: /no/such/file: no such file"),
        (["-n", ""], "--namespace: must not be empty"),
    ],
)
def test_a_bad_kubectl_flag_is_refused_in_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], no_cluster: None, flags: list[str], named: str
) -> None:
    """An unknown context, a missing kubeconfig file, an empty namespace: exit 2, one line."""
    code, _, err = plugin(capsys, "status", "restock", *flags)
    assert code == 2
    assert named in one_line(err)


def test_a_kubeconfig_without_a_current_context_needs_context(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No current context and no --context: exit 2 saying to give --context; with --context
    such a kubeconfig is fine (as for kubectl)."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "k", alice=None, current=False)))
    code, _, err = plugin(capsys, "status", "restock")
    assert code == 2 and "give --context" in one_line(err)
    assert resolve(None, "alice", None).context == "alice"


def test_kubectl_flags_go_before_or_after_the_command_but_not_two_ways(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """`kubectl keelgate -n shop status x` and `... status x -n shop` mean the same; the same
    flag given two different ways is refused (exit 2): which was meant cannot be guessed."""
    cluster.runs["restock"] = run_body(phase="Succeeded")
    assert plugin(capsys, "--context", "bob", "-n", "ops", "status", "restock")[0] == 0
    assert (cluster.target.context, cluster.target.namespace) == ("bob", "ops")
    assert plugin(capsys, "-n", "ops", "status", "restock", "-n", "ops")[0] == 0
    code, _, err = plugin(capsys, "-n", "ops", "status", "restock", "-n", "shop")
    assert code == 2 and "--namespace: given twice" in one_line(err)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_api_server_that_cannot_be_reached_is_exit_5_in_one_line_without_the_token(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real client against a closed port: exit 5, one line naming the server and the
    context, no retry noise, no token; with --output json also the error object."""
    server = f"https://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "k", server=server, alice="shop")))
    code, out, err = plugin(capsys, "status", "restock", "-o", "json")
    assert code == 5
    line = one_line(err)
    assert f"the API server {server} (context alice) cannot be reached" in line
    assert "nothing was read or written" in line
    assert json.loads(out.strip().splitlines()[-1])["exitCode"] == 5
    assert TOKEN not in out + err


# reconcile and approve


def test_both_decisions_at_once_or_none_are_refused_before_any_request(
    capsys: pytest.CaptureFixture[str], no_cluster: None
) -> None:
    """As `keelgate reconcile/approve`: both flags, or neither, is exit 2 and the cluster is
    never contacted; so is an action id that is not one."""
    for args in (
        ["reconcile", "r", "1:0", "--executed", "--not-executed"],
        ["approve", "r", "1:0", "--approve", "--deny"],
    ):
        code, _, err = plugin(capsys, *args)
        assert code == 2 and "not both" in one_line(err)
    code, _, err = plugin(capsys, "reconcile", "r", "1:0")
    assert code == 2 and "say whether it took effect" in one_line(err)


def test_a_malformed_action_id_is_refused_before_anything_is_asked(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """`reconcile r place_order --executed`: exit 2 naming ACTION; nobody was asked anything."""
    code, _, err = plugin(capsys, "reconcile", "restock", "place_order", "--executed")
    assert code == 2 and "ACTION" in one_line(err)
    assert not cluster.asked and not cluster.patches


def test_reconcile_patches_the_runs_reconciliation_for_that_action_in_the_users_own_name(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """The Reconciliation is the one whose spec.runName and spec.action match (not another
    run's, not another action's); `by` is what the API server says the user is; the access
    review asks for `patch` on that very object; the merge patch holds executed, by and note."""
    cluster.runs["restock"] = run_body(phase="Stopped")
    cluster.objects["Reconciliation"] = [
        decision("Reconciliation", "restock", "1:0"),
        decision("Reconciliation", "restock", "2:0"),
        decision("Reconciliation", "restock-b", "2:0"),
    ]
    code, out, _ = plugin(
        capsys, "reconcile", "restock", "2:0", "--executed", "--note", "order 4417 is in the book"
    )
    assert code == 0
    assert cluster.asked == [("patch", "reconciliations", "restock-2-place-order")]
    assert cluster.patches == [
        (
            "Reconciliation",
            "restock-2-place-order",
            {"executed": True, "by": "alice", "note": "order 4417 is in the book"},
        )
    ]
    assert "restock 2:0 (place_order): executed by alice" in out


def test_not_executed_is_refused_until_the_runs_deadline_for_it_has_passed(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """--not-executed before the moment the run's status names for the action (its call may
    still be sent until then) is exit 4, saying when, and patches nothing; --executed is taken
    at once; once the moment has passed, --not-executed is taken."""
    import datetime as dt

    def moment(seconds: float) -> str:
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
        return at.strftime("%Y-%m-%dT%H:%M:%SZ")

    later = moment(120)
    unknown = [
        {
            "action": "2:0",
            "tool": "place_order",
            "idempotencyKey": "kg-2",
            "notExecutedAfter": later,
        },
        {
            "action": "3:0",
            "tool": "place_order",
            "idempotencyKey": "kg-3",
            "notExecutedAfter": later,
        },
        {
            "action": "4:0",
            "tool": "place_order",
            "idempotencyKey": "kg-4",
            "notExecutedAfter": moment(-5),
        },
    ]
    cluster.runs["restock"] = run_body(phase="Stopped", unknownActions=unknown)
    cluster.objects["Reconciliation"] = [
        decision("Reconciliation", "restock", a) for a in ("2:0", "3:0", "4:0")
    ]
    code, _, err = plugin(capsys, "reconcile", "restock", "2:0", "--not-executed")
    assert code == 4
    assert later in err and "cannot be settled as not executed yet" in err
    assert len(err.strip().splitlines()) == 1
    assert cluster.patches == []
    assert plugin(capsys, "reconcile", "restock", "3:0", "--executed")[0] == 0
    assert plugin(capsys, "reconcile", "restock", "4:0", "--not-executed")[0] == 0
    assert [(name, spec["executed"]) for _, name, spec in cluster.patches] == [
        ("restock-3-place-order", True),
        ("restock-4-place-order", False),
    ]


def test_approve_and_deny_add_a_decision_of_your_own(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """--deny adds {by: you, groups: yours, approved: false} to spec.decisions (without a note,
    none), making the list on an Approval made before lists were; JSON says so."""
    cluster.user = "bob@example.com"
    cluster.runs["restock"] = run_body(
        phase="Stopped",
        stopReason="awaiting_approval",
        pendingApprovals=[{"action": "2:0", "tool": "place_order", "definition": "d-1"}],
    )
    cluster.objects["Approval"] = [decision("Approval", "restock", "2:0")]
    code, out, _ = plugin(capsys, "approve", "restock", "2:0", "--deny", "-o", "json")
    assert code == 0
    ((kind, name, patch),) = cluster.patches
    entry = {
        "by": "bob@example.com",
        "groups": ["system:authenticated"],
        "approved": False,
        "definition": "d-1",  # the call as it was shown: a decision on another is not counted
    }
    assert (kind, name, patch) == (
        "Approval",
        "restock-2-place-order",
        {"decisions+": entry, "first": True},
    )
    assert json.loads(out.strip().splitlines()[-1]) == {
        "run": "restock",
        "action": "2:0",
        "tool": "place_order",
        "verdict": "denied",
        "by": "bob@example.com",
        "approval": "restock-2-place-order",
        "already": False,
    }


def test_approve_decides_on_the_round_the_run_asks_in(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """An action asked afresh has two Approvals, the first settled as expired: approve adds to
    the round the run's status names (round 2), and status names that Approval; while the
    round's Approval is not there yet, the expired one is refused in one line naming where to
    decide (exit 2), and nothing is patched."""
    cluster.user = "bob@example.com"
    second = action_object_name("restock", "2:0", "place_order", round=2)
    expired = {
        **decision("Approval", "restock", "2:0"),
        "status": {"phase": "Settled", "verdict": "expired", "askedAgainAs": second},
    }
    cluster.runs["restock"] = run_body(
        phase="Stopped",
        stopReason="awaiting_approval",
        pendingApprovals=[{"action": "2:0", "tool": "place_order", "round": 2}],
    )
    cluster.objects["Approval"] = [expired]
    code, _, err = plugin(capsys, "approve", "restock", "2:0", "--approve")
    assert code == 2 and f"is asked afresh on approval {second}" in one_line(err)
    assert cluster.patches == []
    fresh = decision("Approval", "restock", "2:0")
    fresh["metadata"]["name"] = second
    cluster.objects["Approval"] = [expired, fresh]
    assert plugin(capsys, "approve", "restock", "2:0", "--approve")[0] == 0
    ((_, name, _),) = cluster.patches
    assert name == second
    code, out, _ = plugin(capsys, "status", "restock", "-o", "json")
    assert json.loads(out)["pendingApprovals"][0]["approval"] == second


def test_a_user_who_may_not_patch_is_refused_in_one_line_and_nothing_is_patched(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """The SelfSubjectAccessReview says no: exit 1, one line naming the user, the object and
    the namespace, and no patch is sent."""
    cluster.user, cluster.allowed = "bob", False
    cluster.objects["Reconciliation"] = [decision("Reconciliation", "restock", "1:0")]
    code, _, err = plugin(capsys, "reconcile", "restock", "1:0", "--executed")
    assert code == 1
    line = one_line(err)
    assert "bob may not patch reconciliation restock-1-place-order in namespace shop" in line
    assert "nothing was changed" in line
    assert not cluster.patches


def test_the_same_decision_again_is_a_no_op_and_a_different_one_is_refused(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """A retried command (the decision already in spec, or settled by a confirmer the same
    way) exits 0 without a patch; the opposite decision is exit 2: a decision cannot change."""
    cluster.objects["Reconciliation"] = [
        decision("Reconciliation", "restock", "1:0", executed=True, by="alice"),
        {
            **decision("Reconciliation", "restock", "2:0"),
            "status": {"phase": "Settled", "verdict": "abandoned", "source": "confirmer"},
        },
    ]
    code, out, _ = plugin(capsys, "reconcile", "restock", "1:0", "--executed")
    assert code == 0 and "already executed by alice" in out
    code, out, _ = plugin(capsys, "reconcile", "restock", "2:0", "--not-executed")
    assert code == 0 and "already abandoned by confirmer" in out
    code, _, err = plugin(capsys, "reconcile", "restock", "1:0", "--not-executed")
    assert code == 2 and "already decided: executed by alice" in one_line(err)
    assert "a decision cannot change" in err
    assert not cluster.patches and not cluster.asked


def _not_executed_early(
    action: str, *, by: str = "alice", held: bool = False, looked_at: int = 3
) -> JSON:
    """A Reconciliation (generation 3) whose "not executed" by ``by`` was written before the
    call's write deadline: ``held``, the operator holds it (the deadline not yet passed),
    else it refused it (DecidedTooEarly, the deadline passed), in the generation
    ``looked_at``."""
    body = decision("Reconciliation", "restock", action, executed=False, by=by)
    body["metadata"]["generation"] = 3
    if held:
        body["status"] = {
            "phase": "Pending",
            "notExecutedAfter": stamp(time.time() + 120),
            "heldGeneration": looked_at,
            "message": "not executed was written before ...",
        }
        return body
    refused = {"reason": "DecidedTooEarly", "message": "written too early"}
    body["status"] = {
        "phase": "Pending",
        "notExecutedAfter": stamp(time.time() - 30),
        "heldGeneration": 1,
        "message": "written too early",
        "conditions": [
            {"type": "Ready", "status": "False", "observedGeneration": looked_at, **refused},
            {"type": "Stalled", "status": "True", "observedGeneration": looked_at, **refused},
        ],
    }
    return body


def test_a_not_executed_written_too_early_is_written_again_or_corrected_by_its_maker_only(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """A "not executed" the operator refused as written before the call's write deadline
    (DecidedTooEarly): its maker's --not-executed writes it again (a new decidedAt, now), and
    --executed corrects it; held before the deadline, --not-executed is still exit 4 saying
    when, and --executed corrects it at once. Anyone else is refused in one line naming who
    may (exit 1), before any access review or patch. A refusal of an earlier generation (her
    new decision not looked at yet) is a retried command: already abandoned, no patch."""
    cluster.runs["restock"] = run_body(phase="Stopped")
    cluster.objects["Reconciliation"] = [
        _not_executed_early("1:0"),
        _not_executed_early("2:0"),
        _not_executed_early("3:0", held=True),
        _not_executed_early("4:0", held=True),
        _not_executed_early("5:0", looked_at=2),
    ]
    cluster.user = "bob"
    for action, flag in (("1:0", "--not-executed"), ("2:0", "--executed"), ("3:0", "--executed")):
        code, _, err = plugin(capsys, "reconcile", "restock", action, flag)
        assert code == 1, err
        assert "only alice, who made it, may write it again or correct it to executed" in (
            one_line(err)
        )
    assert not cluster.patches and not cluster.asked

    cluster.user = "alice"
    code, out, _ = plugin(capsys, "reconcile", "restock", "1:0", "--not-executed")
    assert code == 0 and "restock 1:0 (place_order): abandoned by alice" in out
    assert "already" not in out
    assert plugin(capsys, "reconcile", "restock", "2:0", "--executed")[0] == 0
    code, _, err = plugin(capsys, "reconcile", "restock", "3:0", "--not-executed")
    assert code == 4 and "cannot be settled as not executed yet" in one_line(err)
    assert plugin(capsys, "reconcile", "restock", "4:0", "--executed")[0] == 0
    code, out, _ = plugin(capsys, "reconcile", "restock", "5:0", "--not-executed")
    assert code == 0 and "already abandoned by alice" in out
    assert [(name, spec) for _, name, spec in cluster.patches] == [
        ("restock-1-place-order", {"executed": False, "by": "alice"}),
        ("restock-2-place-order", {"executed": True, "by": "alice"}),
        ("restock-4-place-order", {"executed": True, "by": "alice"}),
    ]
    assert len(cluster.stated) == 3  # each states when it was made (the fake checks: now)


def test_no_object_for_the_action_names_what_is_waiting_and_no_run_says_so(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """An action without a Reconciliation: exit 2 listing the ones still waiting; a run that
    does not exist: exit 2 saying so."""
    cluster.runs["restock"] = run_body(phase="Stopped")
    cluster.objects["Reconciliation"] = [decision("Reconciliation", "restock", "1:0")]
    code, _, err = plugin(capsys, "reconcile", "restock", "3:0", "--executed")
    assert code == 2
    assert "no Reconciliation for action 3:0; waiting: 1:0 (restock-1-place-order)" in err
    code, _, err = plugin(capsys, "reconcile", "gone", "1:0", "--executed")
    assert code == 2 and "no AgentRun named 'gone'" in one_line(err)


# resume


def test_resume_merge_patches_only_the_named_budgets_and_says_what_changed(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """New totals go into spec.budget as a merge patch (dollars as the CRD's decimal string,
    never an exponent); the output says each old and new value."""
    cluster.runs["restock"] = run_body(phase="Stopped", stopReason="token_budget", resumable=True)
    code, out, _ = plugin(
        capsys, "resume", "restock", "--tokens", "100000", "--dollars", "1e2", "--timeout", "600"
    )
    assert code == 0
    assert cluster.patches == [
        (
            "AgentRun",
            "restock",
            {"budget": {"tokens": 100000, "dollars": "100", "timeoutSeconds": 600}},
        )
    ]
    assert "spec.budget.tokens 2000 → 100000" in out
    assert "spec.budget.dollars unlimited → 100" in out


def test_resume_refuses_nothing_named_and_bad_numbers_before_any_request(
    capsys: pytest.CaptureFixture[str], no_cluster: None
) -> None:
    """No budget named, a dollar amount that is not a number, a negative total: exit 2."""
    for args, named in (
        ([], "name at least one budget"),
        (["--dollars", "lots"], "--dollars"),
        (["--tokens", "0"], "--tokens"),
        (["--tokens", str(2**63)], "--tokens"),
    ):
        code, _, err = plugin(capsys, "resume", "restock", *args)
        assert code == 2 and named in one_line(err), (args, err)


def test_resume_leaves_a_finished_run_alone_and_warns_about_totals_already_used(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """A run that met its goal is not patched (exit 0, a warning says why); a total not above
    what is used is patched but warned about; unchanged totals patch nothing."""
    cluster.runs["done"] = run_body("done", phase="Succeeded", stopReason="goal_met")
    code, _, err = plugin(capsys, "resume", "done", "--tokens", "100000")
    assert code == 0 and "done has finished: it met its goal" in err
    cluster.runs["restock"] = run_body(
        phase="Stopped",
        stopReason="token_budget",
        usage={"inputTokens": 1900, "outputTokens": 200, "dollars": "0", "activeSeconds": 1},
    )
    code, _, err = plugin(capsys, "resume", "restock", "--tokens", "2050")
    assert code == 0 and "--tokens 2050 is a new total, not more: 2100 is already used" in err
    code, out, _ = plugin(capsys, "resume", "restock", "--max-iterations", "5")
    assert code == 0 and "nothing changed" in out
    assert cluster.patches == [("AgentRun", "restock", {"budget": {"tokens": 2050}})]


# status


STOPPED = {
    "phase": "Stopped",
    "stopReason": "outcome_unknown",
    "resumable": True,
    "message": "place_order (2:0) may or may not have run; reconcile it",
    "iteration": 2,
    "usage": {"inputTokens": 120, "outputTokens": 20, "dollars": "0.01", "activeSeconds": 3.2},
    "conditions": [
        {"type": "Succeeded", "status": "False", "reason": "outcome_unknown", "message": ""},
        {
            "type": "OutcomeUnknown",
            "status": "True",
            "reason": "WriteInFlight",
            "message": "place_order (2:0): see reconciliation restock-2-place-order",
        },
    ],
    "unknownActions": [{"action": "2:0", "tool": "place_order", "idempotencyKey": "kg-1"}],
    "pendingApprovals": [],
    "step": {"number": 2, "attempt": 2, "pod": "restock-s2-a2", "state": "Ended"},
}


def test_status_draws_the_run_as_a_tree_ending_with_what_to_run(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """Phase and stop, message, usage, the step pod and how it ended, conditions, the actions
    by iteration with their objects (decided ones with who decided), and the commands next."""
    cluster.runs["restock"] = run_body(**STOPPED)
    cluster.pods = [step_pod("restock", 2, 2, exit_code=3)]
    cluster.objects["Reconciliation"] = [
        decision("Reconciliation", "restock", "2:0"),
        {
            **decision("Reconciliation", "restock", "1:1", tool="notify"),
            "status": {"phase": "Settled", "verdict": "executed", "settledBy": "carol"},
        },
    ]
    code, out, _ = plugin(capsys, "status", "restock")
    assert code == 3
    for expected in (
        "AgentRun shop/restock  Stopped  outcome_unknown (resumable)",
        "message: place_order (2:0) may or may not have run",
        "iteration 2 · tokens 140 (in 120 / out 20) · $0.01 · active 3.2s",
        "step 2, attempt 2: pod restock-s2-a2, exit code 3 (Error): a resumable stop",
        "OutcomeUnknown=True  WriteInFlight",
        "1:1 notify: executed by carol → reconciliation restock-1-1-notify",
        "2:0 place_order: outcome unknown (Idempotency-Key kg-1) → reconciliation "
        "restock-2-place-order",
        "kubectl keelgate reconcile restock 2:0 --executed -n shop",
        "kubectl keelgate reconcile restock 2:0 --not-executed -n shop",
    ):
        assert expected in out, f"{expected!r} not in\n{out}"
    actions = out.index("actions that asked for a person")
    assert actions < out.index("iteration 1\n") < out.index("iteration 2\n") < out.index("next")


@pytest.mark.parametrize(
    ("status", "code", "next_line"),
    [
        ({"phase": "Succeeded", "stopReason": "goal_met"}, 0, "kubectl keelgate audit restock"),
        ({"phase": "Failed", "stopReason": "failed"}, 1, "kubectl keelgate logs restock"),
        ({"phase": "Running"}, 0, "kubectl wait --for=condition=Succeeded agentrun/restock"),
        ({"phase": "Pending"}, 0, "kubectl wait"),
        (
            {"phase": "Stopped", "stopReason": "dollar_budget", "resumable": True},
            3,
            "kubectl keelgate resume restock --dollars D",
        ),
        (
            {
                "phase": "Stopped",
                "stopReason": "awaiting_approval",
                "pendingApprovals": [{"action": "1:0", "tool": "place_order"}],
            },
            3,
            "kubectl keelgate approve restock 1:0 --approve",
        ),
        (
            {
                "phase": "Stopped",
                "conditions": [{"type": "Stalled", "status": "True", "reason": "StepsFailing"}],
            },
            3,
            "kubectl edit agentrun restock",
        ),
    ],
)
def test_status_exit_code_and_next_step_follow_the_phase(
    capsys: pytest.CaptureFixture[str],
    cluster: FakeCluster,
    status: JSON,
    code: int,
    next_line: str,
) -> None:
    """As kubectl users expect: 0 succeeded or under way (a running run is not an error),
    1 failed, 3 stopped until someone acts (a decision, a budget, a stall); `next` names the
    command that moves it on."""
    cluster.runs["restock"] = run_body(**status)
    got, out, _ = plugin(capsys, "status", "restock", "-o", "json")
    assert got == code
    document = json.loads(out.strip().splitlines()[-1])
    assert document["phase"] == status["phase"]
    assert any(line.startswith(next_line) for line in document["next"]), document["next"]


def test_status_of_a_run_whose_pod_the_user_may_not_read_still_shows_the_run(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the step pod is refused: the tree says so where the pod's end would be."""
    cluster.runs["restock"] = run_body(**STOPPED)

    def refused(name: str) -> JSON:
        raise Refused("pod restock-s2-a2: forbidden", status=403)

    monkeypatch.setattr(cluster, "pod", refused)
    code, out, _ = plugin(capsys, "status", "restock")
    assert code == 3 and "not readable (pod restock-s2-a2: forbidden)" in out


def test_status_says_when_the_operator_has_not_yet_seen_the_latest_spec(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """Right after `resume`, the status is of the previous spec: the tree says so."""
    cluster.runs["restock"] = run_body(**STOPPED, observedGeneration=1)
    cluster.runs["restock"]["metadata"]["generation"] = 2
    code, out, _ = plugin(capsys, "status", "restock")
    assert code == 3
    assert "has not acted on the latest spec yet (generation 2, observed 1)" in out


# logs


def test_logs_come_in_step_then_attempt_order_each_headed_by_how_its_pod_ended(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """Numbers, not text: s2 before s10, a1 before a2; each header names the pod and its end
    (137 is SIGKILL); a password in a log line is masked."""
    cluster.runs["restock"] = run_body(phase="Succeeded")
    cluster.pods = [
        step_pod("restock", 10, 1, exit_code=0),
        step_pod("restock", 2, 1, exit_code=0),
        step_pod("restock", 1, 2, exit_code=3),
        step_pod("restock", 1, 1, exit_code=137),
    ]
    cluster.logs = {
        p["metadata"]["name"]: f"{p['metadata']['name']} says hi\n" for p in cluster.pods
    }
    cluster.logs["restock-s1-a1"] = f"store postgresql://keelgate:{STORE_PASSWORD}@db/k down\n"
    code, out, _ = plugin(capsys, "logs", "restock")
    assert code == 0
    headers = [line for line in out.splitlines() if line.startswith("==> ")]
    assert [h.split()[1] for h in headers] == [
        "restock-s1-a1",
        "restock-s1-a2",
        "restock-s2-a1",
        "restock-s10-a1",
    ]
    assert "(step 1, attempt 1): exit code 137 (Error): killed by signal 9 (SIGKILL)" in headers[0]
    assert "exit code 3 (Error): a resumable stop" in headers[1]
    assert "restock-s10-a1 says hi" in out
    assert STORE_PASSWORD not in out and "postgresql://keelgate:***@db/k" in out


def test_a_log_that_cannot_be_read_is_said_and_the_others_are_still_shown(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """One pod's log refused: every other log is printed, that pod says why, exit 1 with one
    error line; a pod whose container never started has no log and is no error."""
    cluster.pods = [step_pod("restock", 1, 1), step_pod("restock", 2, 1)]
    cluster.pods.append({"metadata": {"name": "restock-s3-a1"}, "status": {"phase": "Pending"}})
    cluster.logs = {"restock-s2-a1": "second\n"}
    code, out, err = plugin(capsys, "logs", "restock")
    assert code == 1
    assert "second" in out and "log of pod restock-s1-a1: the node is gone" in out
    assert "restock-s3-a1 (step 3, attempt 1): pending" in out
    assert "could not read the log of restock-s1-a1" in one_line(err)


def test_logs_of_a_run_that_does_not_exist_is_exit_2(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    code, _, err = plugin(capsys, "logs", "nope")
    assert code == 2 and "no AgentRun named 'nope'" in one_line(err)


# audit


@pytest.fixture
def stored_run(tmp_path: Path) -> str:
    """A finished run `restock-py` of tenant `shop` in a SQLite store; its URL."""
    from keelgate import Budget, Loop, LoopSpec, SideEffect, open_stores
    from keelgate.adapters.models.scripted import ScriptedModel
    from keelgate.adapters.tools.python import PythonTool

    def place_order(args: JSON, *, idempotency_key: str | None) -> JSON:
        return {"ordered": args["qty"]}

    url = f"sqlite:///{tmp_path / 'keelgate.db'}"
    stores = open_stores(url)
    try:
        model = ScriptedModel(
            [
                {"actions": [{"tool": "place_order", "args": {"sku": "SECRET-SKU", "qty": 2}}]},
                {"done": True, "answer": "ordered"},
            ]
        )
        loop = Loop(
            stores=stores,
            model=model,
            tools=[PythonTool("place_order", place_order, SideEffect.WRITE)],
        )
        spec = LoopSpec(tenant="shop", run="restock-py", goal="g", budget=Budget(max_iterations=5))
        loop.run_or_resume(spec)
    finally:
        stores.close()
    return url


def test_audit_reads_the_store_for_the_contexts_namespace_and_verifies(
    capsys: pytest.CaptureFixture[str],
    no_cluster: None,
    stored_run: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`audit RUN --verify` with KEELGATE_STORE: the tenant is the kubeconfig context's
    namespace (no API server asked), the trail is `keelgate audit`'s, verified (exit 0), and
    no tool argument is printed."""
    monkeypatch.setenv("KEELGATE_STORE", stored_run)
    code, out, _ = plugin(capsys, "audit", "restock-py", "--verify")
    assert code == 0
    assert "audit trail of restock-py" in out and "chain verified" in out
    assert "SECRET-SKU" not in out
    code, out, _ = plugin(capsys, "audit", "restock-py", "-o", "json", "--store", stored_run)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["events"]


def test_audit_needs_a_store_and_a_store_that_cannot_be_reached_is_exit_5(
    capsys: pytest.CaptureFixture[str], no_cluster: None
) -> None:
    """No --store nor KEELGATE_STORE: exit 2 saying the trail is in the store; a PostgreSQL
    store that does not answer: exit 5, its password never shown."""
    code, _, err = plugin(capsys, "audit", "restock", "-n", "shop")
    assert code == 2 and "--store" in one_line(err) and "not in the cluster" in err
    url = f"postgresql://keelgate:{STORE_PASSWORD}@127.0.0.1:{_closed_port()}/keelgate"
    code, out, err = plugin(capsys, "audit", "restock", "-n", "shop", "--store", url)
    assert code == 5 and one_line(err).startswith("kubectl keelgate: error: --store:")
    assert STORE_PASSWORD not in out + err


def test_a_missing_object_from_the_api_is_bad_input_not_a_crash() -> None:
    """A 404 is NotFound, an InputError (exit 2): the commands turn it into their own words."""
    assert isinstance(NotFound("pod x"), InputError)
    assert str(NotFound("pod x")) == "pod x: not found"


# The client's errors, without a server


def _client() -> Any:
    from kubernetes import client

    from keelgate.cli.plugin.client import ClusterClient

    configuration = client.Configuration()
    configuration.host = "https://api.example:6443"
    return ClusterClient(Target("", "alice", "shop"), api_client=client.ApiClient(configuration))


def test_a_lost_answer_to_a_patch_is_not_called_nothing_written() -> None:
    """No connection: exit 5 saying nothing was read or written. A patch whose answer was
    lost: exit 5 too, but saying it may have landed and that running it again is safe."""
    import urllib3

    from keelgate.errors import ClusterUnavailable

    api = _client()

    def refused(**_: Any) -> None:
        reason = urllib3.exceptions.NewConnectionError(None, "[Errno 111] Connection refused")  # type: ignore[arg-type]
        raise urllib3.exceptions.MaxRetryError(None, "/x", reason)  # type: ignore[arg-type]

    def cut_off(**_: Any) -> None:
        raise urllib3.exceptions.ProtocolError("Connection aborted.")

    with pytest.raises(ClusterUnavailable) as caught:
        api._call("patch approval x", refused, writes=True)
    assert "https://api.example:6443 (context alice) cannot be reached: Connection refused" in str(
        caught.value
    )
    assert "nothing was read or written" in str(caught.value)
    with pytest.raises(ClusterUnavailable) as caught:
        api._call("patch approval x", cut_off, writes=True)
    assert "may or may not have been made: the same command again is safe" in str(caught.value)


def test_the_api_servers_own_sentence_is_the_error_line() -> None:
    """A 403 or 422 carries the API server's Status message (one line); a 404 is NotFound."""
    from kubernetes.client.exceptions import ApiException

    api = _client()

    def answers(status: int, message: str) -> Any:
        def request(**_: Any) -> None:
            error = ApiException(status=status, reason="Forbidden")
            error.body = json.dumps({"kind": "Status", "message": message})
            raise error

        return request

    with pytest.raises(Refused) as refused:
        api._call("list reconciliations", answers(403, 'User "bob" cannot\nlist it'))
    assert str(refused.value) == 'list reconciliations: User "bob" cannot list it'
    with pytest.raises(NotFound):
        api._call("pod x", answers(404, "pods x not found"))


def test_audit_export_and_verify_are_found_after_kubectls_flags() -> None:
    """`kubectl keelgate [flags] audit export|verify ...` reaches the signed-export commands,
    with kubectl's flags before the command or after it; `audit RUN` (even a run named like a
    flag's value) stays the trail's display."""
    from keelgate.cli.plugin import _audit_tool

    assert _audit_tool(["audit", "export", "restock"]) == "export"
    assert _audit_tool(["-n", "shop", "--context", "alice", "audit", "verify", "f"]) == "verify"
    assert _audit_tool(["--namespace=shop", "audit", "export", "r"]) == "export"
    assert _audit_tool(["audit", "restock", "--verify"]) is None
    assert _audit_tool(["-n", "audit", "status", "export"]) is None
    assert _audit_tool([]) is None


# list and pending


def _aged(body: JSON, minutes: int, namespace: str = "shop") -> JSON:
    when = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes)
    body["metadata"]["creationTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    body["metadata"]["namespace"] = namespace
    return body


def test_pending_lists_what_waits_for_a_person_oldest_first_with_the_command(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """`kubectl keelgate pending`: undecided Reconciliations and Approvals, oldest first, each
    with how long it has waited and the command that decides it; a settled one, or one decided
    in spec that the operator has yet to record, waits for nobody and is left out."""
    cluster.objects["Reconciliation"] = [
        _aged(decision("Reconciliation", "restock", "2:0", idempotencyKey="kg-9"), 5),
        _aged(decision("Reconciliation", "old", "1:0", executed=True, by="al"), 90),
    ]
    cluster.objects["Approval"] = [_aged(decision("Approval", "payout", "1:0"), 120)]
    cluster.runs["payout"] = run_body(
        "payout", phase="Stopped", pendingApprovals=[{"action": "1:0", "tool": "place_order"}]
    )
    code, out, _ = plugin(capsys, "pending")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split()[:5] == ["KIND", "RUN", "ACTION", "TOOL", "WAITING"]
    assert [line.split()[1] for line in lines[1:]] == ["payout", "restock"]
    assert lines[1].split()[4] == "2h" and lines[2].split()[4] == "5m"
    assert "kubectl keelgate approve payout 1:0 --approve|--deny -n shop" in lines[1]
    assert "kubectl keelgate reconcile restock 2:0 --executed|--not-executed -n shop" in lines[2]
    code, out, _ = plugin(capsys, "pending", "-o", "name")
    assert out.split() == [
        "approval.keelgate.dev/payout-1-place-order",
        "reconciliation.keelgate.dev/restock-2-place-order",
    ]
    code, out, _ = plugin(capsys, "pending", "-o", "wide")
    assert "kg-9" in out and "NOT EXECUTED AFTER" in out


def test_pending_across_namespaces_and_json_and_nothing_waiting(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """-A asks for every namespace and shows a NAMESPACE column; -o json and -o yaml give a
    kubectl List of the objects; nothing waiting is said in words, exit 0."""
    cluster.objects["Approval"] = [_aged(decision("Approval", "payout", "1:0"), 3, "finance")]
    waits = {"phase": "Stopped", "pendingApprovals": [{"action": "1:0", "tool": "place_order"}]}
    cluster.runs["payout"] = _aged(run_body("payout", **waits), 3, "finance")
    code, out, _ = plugin(capsys, "pending", "-A")
    assert code == 0 and out.splitlines()[0].split()[0] == "NAMESPACE"
    assert out.splitlines()[1].split()[0] == "finance"
    assert ("list", "Approval", "all") in cluster.asked
    code, out, _ = plugin(capsys, "pending", "-o", "json")
    listed = json.loads(out)
    assert listed["kind"] == "List" and listed["items"][0]["spec"]["runName"] == "payout"
    assert listed["items"][0]["you"] == {"mayDecide": True}
    code, out, _ = plugin(capsys, "pending", "-o", "yaml")
    assert yaml.safe_load(out)["items"][0]["kind"] == "Approval"
    cluster.objects["Approval"] = []
    code, out, _ = plugin(capsys, "pending")
    assert code == 0 and out.strip() == "Nothing waits for a person in namespace shop."


def test_pending_everywhere_asks_rbac_in_each_objects_own_namespace(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """-A, alice may patch Reconciliations in finance and not in shop (her kubeconfig's
    namespace): the one in finance waits for her, the one in shop is shown apart with RBAC's
    word for shop."""
    cluster.objects["Reconciliation"] = [
        _aged(decision("Reconciliation", "payout", "1:0"), 3, "finance"),
        _aged(decision("Reconciliation", "restock", "2:0"), 5, "shop"),
    ]
    cluster.patchable = ("finance",)
    code, out, err = plugin(capsys, "pending", "-A")
    assert code == 0, err
    mine, _, apart = out.partition("\nWaiting for others")
    assert "payout" in mine and "restock" not in mine, out
    assert "restock" in apart and "you may not patch reconciliations in shop" in apart, out


def test_pending_everywhere_falls_back_to_the_namespaces_the_user_may_list(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """A user who may list only in their own namespaces (alice, edit in shop): `pending -A`
    and `list -A`, refused cluster-wide, show what is in the namespaces she may list, say so
    in one line on stderr, and exit 0; without the right to list namespaces that is the
    context's; with it, every namespace she may list in, the others skipped."""
    cluster.listable = ("shop",)
    cluster.objects["Approval"] = [
        _aged(decision("Approval", "payout", "1:0"), 3, "shop"),
        _aged(decision("Approval", "secret", "1:0"), 4, "finance"),
    ]
    waits = {"phase": "Stopped", "pendingApprovals": [{"action": "1:0", "tool": "place_order"}]}
    cluster.runs["payout"] = _aged(run_body("payout", **waits), 5, "shop")
    code, out, err = plugin(capsys, "pending", "-A")
    assert code == 0, err
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [["shop", "approval"]]
    assert "secret" not in out
    assert one_line(err) == (
        "kubectl keelgate: warning: you may not list reconciliations and approvals in every "
        "namespace; showing the namespaces you may list: shop"
    )
    code, out, err = plugin(capsys, "list", "-A")
    assert code == 0 and out.splitlines()[1].split()[:2] == ["shop", "payout"], out
    assert "showing the namespaces you may list: shop" in one_line(err)

    cluster.listable = ("shop", "finance")
    cluster.namespace_names = ["finance", "kube-system", "shop"]
    code, out, err = plugin(capsys, "pending", "-A")
    assert code == 0 and "payout" in out and "secret" in out
    assert one_line(err).endswith("showing the namespaces you may list: finance, shop")
    assert ("list", "Reconciliation", "kube-system") in cluster.asked  # forbidden: skipped

    cluster.listable = ()  # not even her own: the cluster's refusal, as before
    cluster.namespace_names = None
    code, _, err = plugin(capsys, "pending", "-A")
    assert code == 1 and "at the cluster scope" in one_line(err)


def test_list_shows_runs_and_wide_their_budgets(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """`kubectl keelgate list`: each run's phase, stop reason, iteration and age; -o wide adds
    tokens used against the budget and what waits for a person."""
    cluster.runs["restock"] = _aged(
        run_body(
            phase="Stopped",
            stopReason="outcome_unknown",
            iteration=2,
            usage={"inputTokens": 120, "outputTokens": 20, "dollars": "0.01", "activeSeconds": 3.2},
            unknownActions=[{"action": "2:0"}],
        ),
        30,
    )
    cluster.runs["done"] = _aged(run_body("done", phase="Succeeded", stopReason="goal_met"), 1)
    code, out, _ = plugin(capsys, "list")
    assert code == 0
    rows = [line.split() for line in out.strip().splitlines()]
    assert rows[0] == ["NAME", "PHASE", "REASON", "ITERATION", "AGE"]
    assert rows[1][:4] == ["done", "Succeeded", "goal_met", "0"]
    assert rows[2] == ["restock", "Stopped", "outcome_unknown", "2", "30m"]
    code, out, _ = plugin(capsys, "list", "-o", "wide")
    wide = out.strip().splitlines()[2].split()
    assert wide[5:] == ["140/2000", "0.01", "3s", "1"]
    code, out, _ = plugin(capsys, "list", "-o", "name")
    assert out.split() == ["agentrun.keelgate.dev/done", "agentrun.keelgate.dev/restock"]


@pytest.mark.parametrize(
    ("args", "rest", "user", "group"),
    [
        (["--as", "alice", "status", "r"], ["status", "r"], "alice", ""),
        (["status", "r", "--as=bob", "--as-group=ops"], ["status", "r"], "bob", "ops"),
        (["list"], ["list"], "", ""),
    ],
)
def test_as_and_as_group_are_taken_anywhere_as_kubectls(
    args: list[str], rest: list[str], user: str, group: str
) -> None:
    """--as/--as-group (before or after the command, with = or a space) become the API
    server's impersonation headers; the command never sees them."""
    from keelgate.cli.plugin.target import Impersonation

    left, impersonation = Impersonation.taken_from(args)
    assert left == rest and impersonation == Impersonation(user, group)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["list", "--as-group", "ops"], "--as-group: needs --as"),
        (["list", "--as"], "--as: needs a value"),
        (["list", "--as=a", "--as=b"], "--as: give it once"),
        (["list", "--as=a", "--as-group=x", "--as-group=y"], "--as-group: give one group"),
    ],
)
def test_bad_impersonation_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], no_cluster: None, args: list[str], words: str
) -> None:
    """Impersonation flags that cannot be used: exit 2, one line, before anything is asked."""
    code, _, err = plugin(capsys, *args)
    assert code == 2 and words in one_line(err)


def test_impersonation_headers_reach_the_api_client(config_file: Path) -> None:
    """The API client the plugin makes carries Impersonate-User and Impersonate-Group when
    --as/--as-group were given, and none otherwise."""
    from keelgate.cli.plugin import target as targets

    try:
        targets.impersonate(targets.Impersonation("alice", "ops"))
        made = targets.connect(resolve(None, None, None))
        assert made.default_headers["Impersonate-User"] == "alice"
        assert made.default_headers["Impersonate-Group"] == "ops"
        targets.impersonate(targets.Impersonation())
        plain = targets.connect(resolve(None, None, None))
        assert "Impersonate-User" not in plain.default_headers
    finally:
        targets.impersonate(targets.Impersonation())


# shell completion (kubectl_complete-keelgate)


def test_completion_offers_commands_flags_runs_and_waiting_actions() -> None:
    """kubectl runs `kubectl_complete-keelgate WORDS... CURRENT`: it answers the plugin's
    commands (with a description), a command's flags, the namespace's runs for RUN (and
    export/verify after audit), the actions still waiting for a decision for ACTION, output
    formats after -o; and never offers file names where none is meant."""
    from keelgate.cli.plugin.completion import NO_FILES, candidates

    fake = FakeCluster()
    fake.runs["restock"] = run_body()
    fake.runs["refill"] = run_body("refill")
    fake.objects["Reconciliation"] = [
        decision("Reconciliation", "restock", "2:0", tool="place_order"),
        decision("Reconciliation", "restock", "1:0", tool="notify", executed=True, by="al"),
    ]
    seen: list[tuple[Any, ...]] = []

    def api(*where: Any) -> FakeCluster:
        seen.append(where)
        return fake

    names, directive = candidates(["st"], api)
    assert [n.split("\t")[0] for n in names] == ["status"] and directive == NO_FILES
    everything = [n.split("\t")[0] for n in candidates([""], api)[0]]
    assert {"status", "pending", "list", "reconcile", "approve", "audit", "logs"} <= set(everything)
    assert candidates(["status", "re"], api)[0] == ["refill", "restock"]
    assert candidates(["audit", ""], api)[0][:2] == ["export", "verify"]
    assert candidates(["-n", "shop", "reconcile", "restock", ""], api)[0] == ["2:0\tplace_order"]
    assert seen[-1][0] == "shop"
    assert "--executed" in candidates(["reconcile", "restock", "2:0", "--ex"], api)[0]
    assert candidates(["list", "-o", ""], api)[0] == ["text", "wide", "json", "yaml", "name"]
    assert candidates(["audit", "verify", "f.json", "--key", ""], api) == ([], 0)


def test_the_completion_program_prints_candidates_then_the_directive(
    capsys: pytest.CaptureFixture[str], no_cluster: None
) -> None:
    """The installed program prints one candidate per line, then `:4` (no file names); a
    cluster it cannot reach gives no candidates, never an error in the shell."""
    from keelgate.cli.plugin.completion import main as complete

    assert "kubectl_complete-keelgate" in {ep.name for ep in entry_points(group="console_scripts")}
    assert complete(["pen"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pending\t") and out[-1] == ":4"
    assert complete(["status", ""]) == 0  # the cluster is not there: nothing, quietly
    assert capsys.readouterr().out.splitlines() == [":4"]


def test_logs_tail_and_since_reach_the_api_server_and_bad_values_are_refused(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """--tail N keeps each pod's last N lines, --since 5m asks for 300 s of them; a tail below
    -1 or a duration that is none are one line naming the flag."""
    cluster.runs["restock"] = run_body(phase="Succeeded")
    cluster.pods = [step_pod("restock", 1, 1, exit_code=0)]
    cluster.logs = {"restock-s1-a1": "one\ntwo\nthree\n"}
    code, out, _ = plugin(capsys, "logs", "restock", "--tail", "2", "--since", "5m")
    assert code == 0 and "one" not in out and "two" in out and "three" in out
    assert ("log", "restock-s1-a1", "tail=2 since=300") in cluster.asked
    for flag, value in (("--tail", "-5"), ("--since", "soon")):
        code, _, err = plugin(capsys, "logs", "restock", flag, value)
        assert code == 2 and flag in one_line(err)


def test_logs_follow_streams_the_running_pod_then_stops_when_the_run_rests(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`logs -f`: the finished pods' logs, then the running pod's log as it is written (headed
    "following", closed by how it ended), and the command returns once the run is at rest."""
    from keelgate.cli.plugin import logs

    monkeypatch.setattr(logs, "FOLLOW_POLL", 0.01)
    cluster.runs["restock"] = run_body(phase="Succeeded")
    cluster.pods = [
        step_pod("restock", 1, 1, exit_code=0),
        step_pod("restock", 2, 1, exit_code=None),
    ]
    cluster.logs = {"restock-s1-a1": "planned\n", "restock-s2-a1": "ordering\ndone\n"}
    code, out, _ = plugin(capsys, "logs", "restock", "-f")
    assert code == 0
    assert out.index("planned") < out.index("==> restock-s2-a1 (step 2, attempt 1): following")
    assert out.index("following") < out.index("ordering") < out.index("done")
    assert "<== restock-s2-a1: exit code 0" in out
    assert out.strip().endswith("restock is Succeeded: nothing more to follow")


def _two_person_run(cluster: FakeCluster) -> JSON:
    """A run alice created whose payment needs two people from payments, not her; its
    Approval, Pending 0 of 2, with the list the operator makes."""
    rule = {"required": 2, "groups": ["payments"], "notCreator": True}
    # The rule in force is the one the run shows waiting; alice's spec may say less (she
    # weakened it after the action was planned): it is not what counts.
    body = run_body(
        "payout",
        phase="Stopped",
        stopReason="awaiting_approval",
        pendingApprovals=[{"action": "1:0", "tool": "send_payment", "rule": rule}],
    )
    body["metadata"]["annotations"] = {"keelgate.dev/created-by": "alice"}
    body["spec"]["tools"] = [{"name": "send_payment", "requiresApproval": True}]
    cluster.runs["payout"] = body
    approval = decision("Approval", "payout", "1:0", "send_payment", decisions=[])
    approval["status"] = {"phase": "Pending", "progress": "0 of 2", "required": 2, "decided": 0}
    cluster.objects["Approval"] = [approval]
    return approval


def test_approve_counts_each_person_once_and_refuses_who_the_rule_cannot_count(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """Two approvals from payments, not the creator: alice (who created the run) and dave (not
    in payments) are refused in one line before anything is written; bob's approval is added
    with his groups; the same command again is a no-op while the operator records it and
    while it counts, and adds a fresh one once his approval no longer counts (it expired);
    carol's deny is added, after which an approval is refused."""
    approval = _two_person_run(cluster)
    payments = ("payments", "system:authenticated")
    for user, groups, words in (
        ("alice", payments, "alice created the run, and its rule asks for someone else"),
        ("dave", ("system:authenticated",), "dave may not decide it: the rule asks 2 approvals"),
    ):
        cluster.user, cluster.groups = user, groups
        code, _, err = plugin(capsys, "approve", "payout", "1:0", "--approve")
        assert code == 2 and words in one_line(err)
    assert cluster.patches == []
    cluster.user, cluster.groups = "bob", payments
    code, out, _ = plugin(capsys, "approve", "payout", "1:0", "--approve", "--note", "ok")
    assert code == 0 and "approved by bob (1 of 2)" in out
    entry = {"by": "bob", "groups": list(payments), "approved": True, "note": "ok"}
    ((_, name, patch),) = cluster.patches
    assert (name, patch) == ("payout-1-send-payment", {"decisions+": entry, "first": False})
    code, out, _ = plugin(capsys, "approve", "payout", "1:0", "--approve")
    assert code == 0 and "already approved by bob" in out  # the operator has yet to record it
    approval["status"].update(decided=1, approvedBy=["bob"], progress="1 of 2")
    assert plugin(capsys, "approve", "payout", "1:0", "--approve")[0] == 0
    assert len(cluster.patches) == 1
    approval["status"].update(approvedBy=[], progress="0 of 2")  # his approval expired
    assert plugin(capsys, "approve", "payout", "1:0", "--approve")[0] == 0
    assert len(cluster.patches) == 2
    cluster.user = "carol"
    assert plugin(capsys, "approve", "payout", "1:0", "--deny")[0] == 0
    approval["status"].update(phase="Settled", verdict="denied", settledBy="carol")
    cluster.user = "erin"
    code, _, err = plugin(capsys, "approve", "payout", "1:0", "--approve")
    assert code == 2 and "already decided: denied by carol" in one_line(err)
    assert len(cluster.patches) == 3


def test_a_decision_shown_for_another_call_is_refused(cluster: FakeCluster) -> None:
    """The inbox passes the Idempotency-Key of the call it showed: an Approval for another key
    (other arguments) is refused, nothing written."""
    approval = _two_person_run(cluster)
    approval["spec"]["idempotencyKey"] = "kg-now"
    cluster.user, cluster.groups = "bob", ("payments",)
    with pytest.raises(SettleError, match="its arguments are not the ones shown"):
        decide(cluster, APPROVAL, "payout", "1:0", True, None, key="kg-seen")
    assert cluster.patches == []
    done = decide(cluster, APPROVAL, "payout", "1:0", True, None, key="kg-now")
    assert (done.by, done.already) == ("bob", False)


def test_age_and_expiry_are_in_kubectls_largest_whole_unit() -> None:
    """AGE and EXPIRES count in the largest whole unit, as kubectl's AGE (45s, 12m, 3h, 2d):
    an age is never negative and unreadable is <unknown>; an expiry past is "now" and none
    is empty."""
    now = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)

    def moment(seconds: int) -> str:
        return (now + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")

    for seconds, shown in ((0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h")):
        assert span(seconds) == shown
        assert age(moment(-seconds), now) == shown
    assert (span(86399), span(86400), span(10 * 86400 + 5)) == ("23h", "1d", "10d")
    assert age(moment(30), now) == "0s" and age(None, now) == "<unknown>"
    assert [expires_in(moment(s), now) for s in (1, 90, 7200, 0, -5)] == [
        "in 1s",
        "in 1m",
        "in 2h",
        "now",
        "now",
    ]
    assert expires_in("", now) == ""


def test_pending_shows_how_many_approvals_count_and_when_the_first_expires(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """An approval with 1 of 2 still waits for a person: `pending` lists it with "1 of 2" and
    when bob's approval stops counting; it is listed until the operator shows it Settled."""
    approval = _aged(_two_person_run(cluster), 10)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=42, seconds=30)
    approval["spec"]["decisions"] = [{"by": "bob", "approved": True}]
    approval["status"].update(
        decided=1,
        progress="1 of 2",
        approvedBy=["bob"],
        expiresAt=later.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    cluster.user, cluster.groups = "carol", ("payments",)
    code, out, _ = plugin(capsys, "pending")
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split()[5:7] == ["APPROVALS", "EXPIRES"]
    assert row.split()[5:9] == ["1", "of", "2", "in"] and row.split()[9] == "42m"
    assert "kubectl keelgate approve payout 1:0 --approve|--deny -n shop" in row
    # Until the operator shows it Settled it still waits: a decision may yet be refused.
    approval["spec"]["decisions"].append({"by": "carol", "approved": True})
    assert "payout" in plugin(capsys, "pending")[1]
    approval["status"].update(phase="Settled", verdict="approved", progress="2 of 2")
    code, out, _ = plugin(capsys, "pending")
    assert out.strip() == "Nothing waits for a person in namespace shop."


@pytest.mark.parametrize(
    ("user", "groups", "args", "words"),
    [
        # The spec says one approval by anyone; the rule in force says two from payments,
        # not alice: alice's own approval is refused, as the operator would refuse it.
        ("alice", ("payments",), ["--approve"], "alice created the run"),
        # A deny by someone the rule does not let decide (a typo in the rule's group, say):
        # refused, never "denied by dave ... the operator carries it out".
        ("dave", ("system:authenticated",), ["--deny"], "dave may not decide it"),
        (
            "system:serviceaccount:shop:ci",
            ("payments",),
            ["--approve"],
            "is a ServiceAccount, and the rule counts people only",
        ),
        ("bob", ("payments",), ["--deny"], "its rule asks a reason to deny"),
    ],
)
def test_a_decision_the_rule_in_force_cannot_count_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    cluster: FakeCluster,
    user: str,
    groups: tuple[str, ...],
    args: list[str],
    words: str,
) -> None:
    """The command line judges with the rule the run shows in force (status.pendingApprovals),
    by the one judge the operator asks (keelgate.core.approvals.refusal): a decision that
    would not count is refused in one line, exit 2, and nothing is written."""
    _two_person_run(cluster)
    rule = {"required": 2, "groups": ["payments"], "notCreator": True, "reasonToDeny": True}
    cluster.runs["payout"]["status"]["pendingApprovals"][0]["rule"] = rule
    cluster.user, cluster.groups = user, groups
    code, out, err = plugin(capsys, "approve", "payout", "1:0", *args)
    assert code == 2, (out, err)
    assert words in one_line(err) and "nothing was changed" in err
    assert "approved by" not in out and "denied by" not in out
    assert cluster.patches == []
    if args == ["--deny"] and user == "bob":
        assert plugin(capsys, "approve", "payout", "1:0", "--deny", "--note", "wrong sku")[0] == 0


def test_a_decision_on_an_action_the_run_does_not_wait_for_is_refused(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """The run no longer lists the action as waiting (it moved on, or was stopped for another
    reason): the command says so, exit 2, nothing written."""
    _two_person_run(cluster)
    cluster.runs["payout"]["status"].update(phase="Running", stopReason="", pendingApprovals=[])
    cluster.user, cluster.groups = "bob", ("payments",)
    code, _, err = plugin(capsys, "approve", "payout", "1:0", "--approve")
    assert code == 2 and "is not waiting for approval now (the run is Running)" in one_line(err)
    assert cluster.patches == []


def test_a_refused_decision_keeps_the_action_in_sight_with_the_reason(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """dave's deny went in by hand (kubectl patch) and the operator refused it: the Approval
    is still Pending. `pending` still lists it (wide: what was not counted and why; -A too), and
    `status` shows it awaiting approval with the refusal under it."""
    approval = _aged(_two_person_run(cluster), 5)
    approval["spec"]["decisions"] = [{"by": "dave", "approved": False}]
    approval["status"]["message"] = (
        "0 of 2 approvals: waiting for 2 more; not counted: dave: payout 1:0: dave may not "
        "decide it: the rule asks 2 approvals from payments, not the run's creator"
    )
    code, out, _ = plugin(capsys, "pending", "-o", "wide")
    assert code == 0 and "payout" in out and "dave may not decide it" in out
    code, out, _ = plugin(capsys, "pending", "-A")
    assert code == 0 and "payout" in out and "Nothing waits for a person" not in out
    code, out, _ = plugin(capsys, "status", "payout")
    assert "awaiting approval" in out
    assert "not counted: dave: payout 1:0: dave may not decide it" in out


STRICT = {"required": 2, "groups": ["payments"], "notCreator": True, "reasonToDeny": True}


def bob_approved_alices_payout(cluster: FakeCluster) -> None:
    """alice's run payout, whose payment needs 2 of payments, not her, a reason to deny
    (STRICT); bob approved it (1 of 2); and an unknown outcome of another run."""
    approval = _aged(_two_person_run(cluster), 10)
    cluster.runs["payout"]["status"]["pendingApprovals"][0]["rule"] = STRICT
    approval["spec"]["decisions"] = [{"by": "bob", "approved": True}]
    approval["status"].update(decided=1, progress="1 of 2", approvedBy=["bob"])
    cluster.objects["Reconciliation"] = [_aged(decision("Reconciliation", "restock", "2:0"), 5)]


def _for_whom(
    cluster: FakeCluster, capsys: pytest.CaptureFixture[str], user: str, *groups: str
) -> tuple[str, str, list[JSON]]:
    """`pending` as ``user``, text and -o json: (what waits for them, the rows apart with
    their reasons, the json items' ``you``)."""
    cluster.user, cluster.groups = user, groups
    code, out, err = plugin(capsys, "pending")
    assert code == 0, err
    mine, _, apart = out.partition("\nWaiting for others")
    code, listed, _ = plugin(capsys, "pending", "-o", "json")
    you = [item["you"] for item in json.loads(listed)["items"]]
    return mine, apart, you


def test_pending_shows_what_waits_for_you_apart_from_what_you_cannot_decide(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    """alice's run needs 2 of payments, not her, a reason to deny; bob approved (1 of 2); she
    weakened the rule in her spec since (the rule in force is the run's). An unknown outcome
    of another run waits too. carol sees both as hers, with the command; alice (the creator)
    sees the approval apart: she may deny it, not approve it; bob: he approved it already;
    dave (in no group the rule names) and a ServiceAccount: why not, and they may not deny
    either. -o json carries the same per object (``you``), and the reason is the judge's."""
    bob_approved_alices_payout(cluster)
    cluster.runs["payout"]["spec"]["tools"][0]["approval"] = {"required": 1}  # weakened

    mine, apart, you = _for_whom(cluster, capsys, "carol", "payments")
    assert "kubectl keelgate approve payout 1:0 --approve|--deny -n shop" in mine
    assert "restock" in mine and not apart
    assert you == [{"mayDecide": True, "reasonToDeny": True}, {"mayDecide": True}]

    cases = {
        ("alice", "payments"): (
            "alice created the run, and its rule asks for someone else (2 approvals from "
            "payments, not the run's creator, a deny with its reason); you may deny it",
            True,
        ),
        ("bob", "payments"): ("you approved it already (1 of 2): it waits for others", True),
        ("dave", "system:authenticated"): (
            "dave may not decide it: the rule asks 2 approvals from payments",
            False,
        ),
        ("system:serviceaccount:shop:ci", "payments"): (
            "system:serviceaccount:shop:ci is a ServiceAccount, and the rule counts people only",
            False,
        ),
    }
    for (user, group), (why, deny) in cases.items():
        mine, apart, you = _for_whom(cluster, capsys, user, group)
        assert "restock" in mine and "payout" not in mine, (user, mine)
        header, row = apart.strip().splitlines()[1:]
        assert header.split()[-4:] == ["EXPIRES", "WHY", "NOT", "YOU"], header
        assert row.split()[:2] == ["approval", "payout"] and why in row, (user, row)
        assert "kubectl keelgate approve" not in row
        (judged,) = [y for y in you if not y["mayDecide"]]
        assert judged["mayDeny"] is deny and why in judged["why"], (user, judged)
        assert judged.get("reasonToDeny", False) is deny  # told to whoever may deny

    # Nothing is theirs: said in words, and what waits for others still shows.
    cluster.objects["Reconciliation"] = []
    mine, apart, _ = _for_whom(cluster, capsys, "alice", "payments")
    assert mine.strip() == "Nothing waits for you in namespace shop."
    assert "payout" in apart and "(1): you cannot decide these" in apart


def test_pending_shows_rbac_refusals_apart_and_lists_all_when_who_you_are_is_unknown(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone RBAC lets read but not patch (the view role) sees the unknown outcome apart,
    with RBAC's word; an API server that cannot say who the user is (no selfsubjectreviews)
    judges nothing: everything is listed as waiting, said once on stderr."""
    cluster.objects["Reconciliation"] = [_aged(decision("Reconciliation", "restock", "2:0"), 5)]
    cluster.allowed = False
    code, out, _ = plugin(capsys, "pending")
    assert code == 0 and out.startswith("Nothing waits for you in namespace shop.")
    assert "RBAC: you may not patch reconciliations in shop (no RBAC policy matched)" in out

    def unknown() -> tuple[str, tuple[str, ...]]:
        raise Refused("the API server does not serve selfsubjectreviews", status=404)

    monkeypatch.setattr(cluster, "identity", unknown)
    code, out, err = plugin(capsys, "pending")
    assert code == 0 and "Waiting for others" not in out
    assert "kubectl keelgate reconcile restock 2:0" in out
    assert "what you may decide is not judged" in one_line(err)


def test_a_decision_made_and_not_yet_recorded_or_refused_is_told_as_it_is(
    cluster: FakeCluster,
) -> None:
    """What someone sees of their own entries: dave's deny went in by hand and the operator
    refused it (he is in no group the rule names): he is told that, never that it waits to be
    recorded. erin's deny and frank's approval (both in payments) are on the object and not
    recorded yet: each is told so, and neither is offered the same decision again."""
    from keelgate.cli.plugin.standing import of_approval

    approval = _two_person_run(cluster)
    run = cluster.runs["payout"]
    approval["spec"]["decisions"] = [{"by": "dave", "approved": False}]
    approval["status"]["message"] = "0 of 2 approvals; not counted: dave: dave may not decide it"
    dave = of_approval(approval, run, user="dave", groups=("system:authenticated",))
    assert (dave.decide, dave.deny) == (False, False)
    assert dave.why.startswith("dave may not decide it: the rule asks 2 approvals from payments")

    approval["spec"]["decisions"].append({"by": "erin", "approved": False})
    erin = of_approval(approval, run, user="erin", groups=("payments",))
    assert (erin.decide, erin.deny) == (False, False)
    assert erin.why.startswith("you denied it; the operator has not recorded it")

    approval["spec"]["decisions"].append({"by": "frank", "approved": True})
    frank = of_approval(approval, run, user="frank", groups=("payments",))
    assert (frank.decide, frank.deny) == (False, True)
    assert frank.why.startswith("you approved it; the operator has not recorded it")
    carol = of_approval(approval, run, user="carol", groups=("payments",))
    assert (carol.decide, carol.why) == (True, "")
