"""The `keelgate` command line in a new user's first hour, run as a user runs it: the console
script in a fresh folder, real pipes (one whose reader is gone), real signals, a real terminal
(a pseudo-terminal) and real read-only media (a read-only bind mount in a private mount
namespace). Each test names what the user sees."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

KEELGATE = str(Path(sys.executable).parent / "keelgate")
PLUGIN = str(Path(sys.executable).parent / "kubectl-keelgate")

TOOLS = """
import json, os, subprocess, sys, time
from pathlib import Path

def look(args, *, idempotency_key):
    print("looking at", args["sku"])            # a tool's own output...
    subprocess.run(["echo", "from a subprocess"])  # ...and a program it starts
    time.sleep(float(os.environ.get("LOOK_SECONDS", "0")))
    return {"sku": args["sku"], "inStock": 3}

def order(args, *, idempotency_key):
    Path("order-started").touch()
    time.sleep(float(os.environ.get("ORDER_SECONDS", "0")))
    with open("book.jsonl", "a") as book:
        book.write(json.dumps({"key": idempotency_key}) + "\\n")
    return {"ordered": True}
"""


def manifest(name: str = "restock", *, iterations: int = 1) -> str:
    """A run that reads the stock ``iterations`` times (one iteration each), then orders once."""
    script = ["      - actions: [{tool: look, args: {sku: A1}}]"] * iterations + [
        "      - actions: [{tool: order, args: {sku: A1, qty: 20}}]",
        "      - done: true",
        "        answer: ordered",
    ]
    return "\n".join(
        [
            "apiVersion: keelgate.dev/v1alpha1",
            "kind: AgentRun",
            f"metadata: {{name: {name}, namespace: shop}}",
            "spec:",
            "  goal: restock",
            "  model:",
            "    provider: scripted",
            "    name: demo",
            "    script:",
            *script,
            "  tools:",
            '    - {name: look, sideEffect: READ, python: {callable: "kgtools:look"}}',
            '    - {name: order, sideEffect: WRITE, python: {callable: "kgtools:order"}}',
            "  budget: {maxIterations: 10000, tokens: 50000}",
            "",
        ]
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A fresh folder holding a manifest and its tool module, nothing run yet."""
    (tmp_path / "kgtools.py").write_text(TOOLS)
    (tmp_path / "run.yaml").write_text(manifest())
    return tmp_path


def user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEELGATE_", "PYTHON"))}
    env.update(extra)
    return env


def keelgate(
    folder: Path, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KEELGATE, *args],
        cwd=folder,
        env=user_env(**env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def orders(folder: Path) -> int:
    book = folder / "book.jsonl"
    return len(book.read_text().splitlines()) if book.exists() else 0


# Pipes


def _into_a_closed_pipe(folder: Path, program: str, *args: str) -> tuple[int, str]:
    """Run with stdout a pipe whose reader is already gone (as `| head -1` leaves it once
    `head` has its line): every write to stdout fails. Returns the exit code and stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [program, *args],
            cwd=folder,
            env=user_env(),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    return done.returncode, done.stderr


def test_a_reader_that_stops_reading_is_not_a_failure(folder: Path) -> None:
    """`keelgate audit RUN --verify | head -1` and the like: a closed pipe makes no error and
    no exit code of its own; each command exits as it would have (0 for a verified chain, 3
    for a run stopped on its budget), with nothing on stderr."""
    assert keelgate(folder, "run", "-f", "run.yaml").returncode == 0
    (folder / "short.yaml").write_text(
        manifest("short").replace("maxIterations: 10000", "maxIterations: 1")
    )
    assert keelgate(folder, "run", "-f", "short.yaml").returncode == 3
    for args, code in [
        (("audit", "restock", "--verify"), 0),
        (("status", "restock"), 0),
        (("status", "short"), 3),
        (("runs",), 0),
        (("runs", "-o", "wide"), 0),
        (("status", "restock", "-o", "json"), 0),
        (("--help",), 0),
        (("run", "-h"), 0),
    ]:
        assert _into_a_closed_pipe(folder, KEELGATE, *args) == (code, ""), args
    assert _into_a_closed_pipe(folder, PLUGIN, "--help") == (0, "")


def test_under_output_json_stdout_holds_the_json_alone(folder: Path) -> None:
    """A tool that prints, and a program it starts, write to stderr while the run is driven:
    `run -o json` prints exactly one line on stdout, the outcome."""
    done = keelgate(folder, "run", "-f", "run.yaml", "-o", "json")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["stopReason"] == "goal_met"
    assert "looking at A1" in done.stderr and "from a subprocess" in done.stderr


def test_a_manifest_can_come_from_standard_input(folder: Path) -> None:
    """`-f -` reads the manifest from stdin, as `kubectl apply -f -` does; its tools are
    imported from the current folder."""
    done = keelgate(folder, "run", "-f", "-", "-o", "json", stdin=manifest())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stopReason"] == "goal_met" and orders(folder) == 1


def test_a_manifest_no_api_server_would_take_is_refused_in_one_line(folder: Path) -> None:
    """A manifest over 1.5 MiB (the API server's limit for one object) is refused before it is
    read, file or stdin: exit 2, one line naming --file and the limit, no store made."""
    big = manifest() + "# " + "x" * (2 * 1024 * 1024) + "\n"
    (folder / "big.yaml").write_text(big)
    for done in (
        keelgate(folder, "run", "-f", "big.yaml"),
        keelgate(folder, "run", "-f", "-", stdin=big),
    ):
        assert done.returncode == 2
        (line,) = done.stderr.splitlines()
        assert line.startswith("keelgate: error: --file:") and "1.5 MiB" in line
    assert not (folder / ".keelgate").exists()


# Help


def _commands(group: object, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    yield path
    for name, command in sorted(getattr(group, "commands", {}).items()):
        yield from _commands(command, (*path, name))


def _every_command() -> list[tuple[str, tuple[str, ...]]]:
    import typer

    from keelgate.cli import cluster, commands, temporal, tenant  # noqa: F401 - registers them
    from keelgate.cli.plugin import commands as plugin_commands
    from keelgate.cli.plugin import listing, logs, ui  # noqa: F401 - registers them

    found = [(KEELGATE, path) for path in _commands(typer.main.get_command(commands.app), ())]
    found += [(KEELGATE, ("audit", "export")), (KEELGATE, ("audit", "verify"))]
    found += [(PLUGIN, path) for path in _commands(typer.main.get_command(plugin_commands.app), ())]
    found += [(PLUGIN, ("audit", "export")), (PLUGIN, ("audit", "verify"))]
    return found


def test_every_help_page_fits_80_columns_and_reads_as_kubectls(tmp_path: Path) -> None:
    """`-h` works on every command of both programs (`keelgate step` too); each page fits 80
    columns even on a wide terminal, names values as kubectl does (no `<bool>`, no `{RUN}`),
    shows no markup escape (`keelgate\\[temporal]`), has a Usage section and, for every
    command that does something, Examples."""
    pages = _every_command()
    assert len(pages) > 30
    for program, path in pages:
        done = subprocess.run(
            [program, *path, "-h"],
            cwd=tmp_path,
            env=user_env(COLUMNS="200"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        name = " ".join((Path(program).name, *path))
        assert done.returncode == 0 and done.stderr == "", (name, done.stderr)
        lines = done.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80, name
        assert "Usage:" in lines, name
        assert not re.search(r"<[a-z][a-z \[\]|]*>", done.stdout), name  # no <bool>, <str>
        assert "\\[" not in done.stdout, name  # no rich markup escape shown as typed
        usage = lines[lines.index("Usage:") + 1]
        assert "{" not in usage and "<" not in usage, name  # no {RUN}
        assert "-h, --help" in done.stdout, name
        if path and path[-1] not in ("temporal", "tenant"):
            assert "Examples:" in lines, name


def test_audit_help_lists_its_export_and_verify_commands(tmp_path: Path) -> None:
    """`keelgate audit -h` names the two commands under it, with their usage."""
    done = keelgate(tmp_path, "audit", "-h")
    assert "keelgate audit export RUN" in done.stdout
    assert "keelgate audit verify FILE" in done.stdout


def test_help_and_readme_list_every_exit_code_keelgate_exits_with(tmp_path: Path) -> None:
    """`keelgate -h` and README.md's table list the same exit codes, and each of them names
    every code the command line and its errors exit with (a step pod's own 75 aside: the
    operator reads that one), so a script written from either meets no code neither names."""
    from keelgate import cli
    from keelgate.errors import KeelgateError, Preempted

    def codes_of(kind: type[KeelgateError]) -> set[int]:
        return {kind.exit_code}.union(*(codes_of(sub) for sub in kind.__subclasses__()))

    exits = codes_of(KeelgateError) - {Preempted.exit_code}
    exits |= {code for name, code in vars(cli).items() if name.startswith("EXIT_")}
    shown = keelgate(tmp_path, "-h").stdout
    table = shown[shown.index("Exit codes:") :]
    found = re.findall(r"(?m)^  (\d+) |; (\d+) terminated", table)
    in_help = {int(code) for pair in found for code in pair if code}
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    table_at = readme.index("| code |", readme.index("Exit codes, the same"))
    rows = re.findall(r"(?m)^\| ([0-9, ]+) \|", readme[table_at : readme.index("\n\n", table_at)])
    in_readme = {int(code) for row in rows for code in row.split(",")}
    assert in_help == in_readme == exits


def test_a_plugin_error_names_the_plugin(tmp_path: Path) -> None:
    """`kubectl keelgate` errors start `kubectl keelgate: error:`, the program the user
    typed, and are one line (exit 2 for an unknown flag)."""
    done = subprocess.run(
        [PLUGIN, "status", "--no-such-flag"],
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("kubectl keelgate: error: ")


# runs and status


def test_runs_lists_as_kubectl_get_does(folder: Path) -> None:
    """`keelgate runs`: a table with AGE; -n one namespace (no NAMESPACE column), -A every
    one; -o wide adds budget columns, -o yaml the document, -o name `agentrun.keelgate.dev/`
    lines that `status` takes back."""
    assert keelgate(folder, "run", "-f", "run.yaml").returncode == 0
    (folder / "other.yaml").write_text(
        manifest("audit").replace("namespace: shop", "namespace: ops")
    )
    assert keelgate(folder, "run", "-f", "other.yaml").returncode == 0
    table = keelgate(folder, "runs").stdout.splitlines()
    assert table[0].split() == ["NAMESPACE", "NAME", "PHASE", "REASON", "ITERATION", "AGE"]
    assert [line.split()[:3] for line in table[1:]] == [
        ["ops", "audit", "Succeeded"],
        ["shop", "restock", "Succeeded"],
    ]
    assert table[1].split()[-1].endswith("s")  # an age, kubectl's way
    every = keelgate(folder, "runs", "-A").stdout.splitlines()
    assert [line.split()[:5] for line in every] == [line.split()[:5] for line in table]
    one = keelgate(folder, "runs", "-n", "shop").stdout.splitlines()
    assert one[0].split()[0] == "NAME" and len(one) == 2
    wide = keelgate(folder, "runs", "-n", "shop", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-4:] == ["TOKENS", "DOLLARS", "ACTIVE", "WAITING"]
    assert wide[1].split()[-4].endswith("/50000")
    import yaml

    listed = yaml.safe_load(keelgate(folder, "runs", "-o", "yaml").stdout)
    assert [run["run"] for run in listed["runs"]] == ["audit", "restock"]
    names = keelgate(folder, "runs", "-n", "shop", "-o", "name").stdout.split()
    assert names == ["agentrun.keelgate.dev/restock"]
    assert keelgate(folder, "status", names[0]).returncode == 0


def _wait_for_the_write(folder: Path) -> None:
    """Until the run's WRITE is being sent (the shop's tool marks it), at most a minute."""
    deadline = time.monotonic() + 60
    while not (folder / "order-started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (folder / "order-started").exists(), "the run never reached its WRITE"


@contextlib.contextmanager
def _driving(folder: Path) -> Iterator[None]:
    """`keelgate run` driving the run, held in its minute-long WRITE, killed (SIGKILL) after."""
    driver = subprocess.Popen(
        [KEELGATE, "run", "-f", "run.yaml"],
        cwd=folder,
        env=user_env(ORDER_SECONDS="60"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_the_write(folder)
        yield
    finally:
        driver.kill()
        driver.wait()


def test_status_tells_a_run_driven_now_from_one_whose_process_is_gone(folder: Path) -> None:
    """While `keelgate run` drives a run, `status` says another process is driving it (exit 4,
    the run is busy) and `runs` says "in progress"; once that process is killed (SIGKILL, no
    word), `status` says no process drives it and resume continues it (exit 3), and `runs`
    says "process gone"."""
    with _driving(folder):
        now = keelgate(folder, "status", "restock")
        assert now.returncode == 4, now.stdout + now.stderr
        assert "another process is driving it now" in now.stdout
        assert "in progress" in keelgate(folder, "runs").stdout
        shown = json.loads(keelgate(folder, "status", "restock", "-o", "json").stdout)
        assert shown["phase"] == "Running" and shown["drivenNow"] is True
    gone = keelgate(folder, "status", "restock")
    assert gone.returncode == 3
    assert "no process drives it" in gone.stdout and "keelgate resume restock" in gone.stdout
    assert "process gone" in keelgate(folder, "runs").stdout
    assert (
        json.loads(keelgate(folder, "status", "restock", "-o", "json").stdout)["drivenNow"] is False
    )


def test_a_second_run_of_a_busy_run_says_busy_at_once(folder: Path) -> None:
    """A second `keelgate run` of a run another process drives exits 4 with one line about as
    fast as the program starts (it waited 5 s before), and runs nothing."""
    with _driving(folder):
        started = time.monotonic()
        baseline = keelgate(folder, "--version")
        startup = time.monotonic() - started
        started = time.monotonic()
        second = keelgate(folder, "run", "-f", "run.yaml")
        took = time.monotonic() - started
    assert baseline.returncode == 0
    assert second.returncode == 4
    (line,) = second.stderr.splitlines()
    assert "busy" in line
    # The program's own start-up (measured just before, on this busy machine) plus the lock's
    # half-second wait and room for the store: far under the 5 s it used to wait.
    assert took < startup * 2 + 2.5, (took, startup)


# Signals


def _run_and_signal(folder: Path, times: int) -> tuple[int, str]:
    """Start `keelgate run` (its WRITE takes 3 s), send SIGINT ``times`` times while the WRITE
    is being sent, and return the exit code and stderr."""
    proc = subprocess.Popen(
        [KEELGATE, "run", "-f", "run.yaml"],
        cwd=folder,
        env=user_env(ORDER_SECONDS="3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal (a background job would hand it SIGINT ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    _wait_for_the_write(folder)
    for _ in range(times):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_one_ctrl_c_during_a_write_lets_the_call_finish_and_be_recorded(folder: Path) -> None:
    """The first Ctrl-C while a WRITE is being sent says it lets the call finish (and how long
    at most), the call ends and is recorded, the run stops at its checkpoint (exit 130) with
    nothing unknown, and resume goes on from there: one order, no reconcile needed."""
    code, err = _run_and_signal(folder, 1)
    assert code == 130
    first, last = [line for line in err.splitlines() if line.startswith("keelgate:")]
    assert (
        first.startswith("keelgate: Ctrl-C: letting the WRITE being sent finish")
        and "s more" in first
    )
    assert "nothing is unknown" in last and "`keelgate resume restock`" in last
    assert orders(folder) == 1
    status = json.loads(keelgate(folder, "status", "restock", "-o", "json").stdout)
    assert status["unknownActions"] == [] and status["drivenNow"] is False
    resumed = keelgate(folder, "resume", "restock")
    assert resumed.returncode == 0, resumed.stderr
    assert orders(folder) == 1


def test_a_second_ctrl_c_cuts_the_write_and_its_outcome_is_unknown(folder: Path) -> None:
    """A second Ctrl-C cuts the call after all: exit 130, and the run then stops with the
    WRITE's outcome unknown, never sent again."""
    code, err = _run_and_signal(folder, 2)
    assert code == 130 and "interrupted" in err.strip().splitlines()[-1]
    resumed = keelgate(folder, "resume", "restock", "-o", "json")
    assert resumed.returncode == 3
    assert json.loads(resumed.stdout.splitlines()[-1])["stopReason"] == "outcome_unknown"
    assert orders(folder) == 0


# Progress


def _on_a_terminal(folder: Path, *args: str, **env: str) -> tuple[int, str]:
    """Run with stderr a pseudo-terminal; return the exit code and what the terminal got."""
    main, secondary = pty.openpty()
    proc = subprocess.Popen(
        [KEELGATE, *args],
        cwd=folder,
        env=user_env(TERM="xterm", **env),
        stdout=subprocess.DEVNULL,
        stderr=secondary,
    )
    os.close(secondary)
    seen = b""
    while True:
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's last writer has gone
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(main)
    return proc.wait(timeout=60), seen.decode(errors="replace")


def test_a_long_run_shows_where_it_is_on_a_terminal_and_nothing_in_a_pipe(folder: Path) -> None:
    """On a terminal, a run that takes a while shows its iteration on one redrawn line of
    stderr, wiped once it ends; into a pipe the same run writes no such line."""
    (folder / "run.yaml").write_text(manifest(iterations=12))
    code, screen = _on_a_terminal(folder, "run", "-f", "run.yaml", LOOK_SECONDS="0.25")
    assert code == 0
    assert "restock: iteration " in screen and "\x1b[K" in screen
    assert screen.rstrip().endswith("\x1b[K")  # wiped at the end
    shutil.rmtree(folder / ".keelgate")
    piped = keelgate(folder, "run", "-f", "run.yaml", LOOK_SECONDS="0.25")
    assert piped.returncode == 0 and "iteration" not in piped.stderr


# Read-only media


def _read_only(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `keelgate ARGS` where ``folder`` is mounted read-only (a bind mount in a mount
    namespace of its own: the filesystem itself refuses writes, root or not)."""
    script = (
        'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && cd "$1" && shift && '
        'touch probe 2>/dev/null && exit 99; exec "$@"'
    )
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(folder), KEELGATE, *args],
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_read_only_commands_read_a_store_on_read_only_media(folder: Path) -> None:
    """A store copied to read-only media is read there: status, runs and audit --verify work,
    and nothing is written; a command that writes is refused as a store that cannot be written
    (exit 5), never a traceback."""
    assert keelgate(folder, "run", "-f", "run.yaml").returncode == 0
    before = sorted(p.name for p in (folder / ".keelgate").iterdir())
    status = _read_only(folder, "status", "restock")
    assert status.returncode == 0, status.stderr
    assert "Succeeded" in status.stdout
    runs = _read_only(folder, "runs")
    assert runs.returncode == 0 and "restock" in runs.stdout, runs.stderr
    audit = _read_only(folder, "audit", "restock", "--verify")
    assert audit.returncode == 0 and "chain verified" in audit.stdout, audit.stderr
    settle = _read_only(folder, "reconcile", "restock", "2:0", "--executed", "--by", "al")
    assert settle.returncode == 5 and "Traceback" not in settle.stderr, settle.stderr
    assert sorted(p.name for p in (folder / ".keelgate").iterdir()) == before


# keelgate tenant add


class _SecretsRefusedOnWrite:
    """A loopback API server (Kubernetes' wire format) where the Secret does not exist, a dry
    run of its creation is accepted, and the real creation is refused (403): what a dry run
    cannot foresee (a quota, a webhook that skips dry runs, a token that expired between)."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.requests: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, code: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                outer.requests.append(f"GET {self.path}")
                self._answer(404, _status(404, "NotFound", 'secrets "keelgate-store" not found'))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                outer.requests.append(f"POST {self.path}")
                if "dryRun=All" in self.path:
                    self._answer(201, body)
                else:
                    self._answer(403, _status(403, "Forbidden", "secrets is forbidden: quota"))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def kubeconfig(self, path: Path) -> Path:
        port = self.server.server_address[1]
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: c, user: u, namespace: shop}}]\n"
        )
        return path

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _status(code: int, reason: str, message: str) -> dict[str, object]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def test_tenant_add_leaves_no_role_behind_when_its_secret_cannot_be_written(
    pg_url: str, tmp_path: Path
) -> None:
    """`keelgate tenant add` checks the cluster first (a dry run of the Secret's write); when
    the real write is refused all the same, the role it had just created is taken away again,
    and the one line says so: no role with a password stored nowhere is left."""
    cluster = _SecretsRefusedOnWrite()
    try:
        kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
        done = keelgate(
            tmp_path, "tenant", "add", "shop", "--store", pg_url, "--kubeconfig", str(kubeconfig)
        )
    finally:
        cluster.stop()
    assert [r.split("?")[0] for r in cluster.requests] == [
        "GET /api/v1/namespaces/shop/secrets/keelgate-store",
        "POST /api/v1/namespaces/shop/secrets",
        "POST /api/v1/namespaces/shop/secrets",
    ]
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert "forbidden" in line and "removed again: nothing changed" in line
    listed = keelgate(tmp_path, "tenant", "list", "--store", pg_url, "-o", "json")
    assert json.loads(listed.stdout)["tenants"] == []


# What it tells the user


def test_a_syntax_error_in_the_users_tool_module_is_bad_input_naming_file_and_line(
    folder: Path,
) -> None:
    """A tool module that does not compile is the user's input: exit 2, one line with the
    file and the line, before any store is made; one that raises as it is imported says what
    and where, exit 2 too."""
    (folder / "kgtools.py").write_text(TOOLS + "\ndef broken(:\n")
    done = keelgate(folder, "run", "-f", "run.yaml")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert f"{folder / 'kgtools.py'}, line " in line and "invalid syntax" in line
    assert "internal error" not in line and not (folder / ".keelgate").exists()
    (folder / "kgtools.py").write_text('raise RuntimeError("no config")\n' + TOOLS)
    done = keelgate(folder, "run", "-f", "run.yaml")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "RuntimeError: no config" in line and f"{folder / 'kgtools.py'}, line 1" in line


def test_a_tool_module_that_cannot_be_found_says_where_it_was_looked_for(
    folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A module in no folder searched: the line names each folder (the manifest's, the
    current one, PYTHONPATH's), so the user sees which one to fix."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (folder / "kgtools.py").rename(folder / "tools_elsewhere.py")
    done = keelgate(elsewhere, "run", "-f", str(folder / "run.yaml"), PYTHONPATH="/opt")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "no module 'kgtools' in " in line
    for place in (str(folder), str(elsewhere), "/opt"):
        assert place in line, place


def test_a_model_server_that_cannot_be_reached_is_resumable_and_the_run_goes_on_later(
    folder: Path,
) -> None:
    """A model server that answers only "503 overloaded": after its retries `run` exits 3
    (resumable: running again is the fix), one line saying the run is where it was; status
    says no process drives it (exit 3); once the server answers, the same command finishes."""
    from fakes.llm import LlmFake, openai_reply
    from fakes.loopback import Answer

    server = LlmFake("openai").start()
    try:
        overloaded = Answer(503, {"error": {"message": "overloaded", "type": "server_error"}})
        server.add(*[overloaded] * 5)
        model = f"  model: {{provider: openai, name: demo, baseURL: '{server.base_url}'}}\n"
        text = re.sub(r"  model:\n.*?(?=  tools:)", model, manifest(), flags=re.DOTALL)
        (folder / "run.yaml").write_text(text)
        done = keelgate(folder, "run", "-f", "run.yaml")
        assert done.returncode == 3, done.stderr
        (line,) = [x for x in done.stderr.splitlines() if "error:" in x]
        assert "the run is where it was" in line and "run the same command again" in line
        assert keelgate(folder, "status", "restock").returncode == 3
        accept = ("keelgate_verdict", {"verdict": "accept", "reason": "ok"})
        server.add(openai_reply(text="nothing to order"), openai_reply(calls=[accept]))
        again = keelgate(folder, "run", "-f", "run.yaml", "-o", "json")
    finally:
        server.stop()
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["stopReason"] == "goal_met"


def test_keelgate_operator_with_no_cluster_to_talk_to_is_one_line(tmp_path: Path) -> None:
    """`keelgate operator` outside a pod, with no kubeconfig: one line saying there is no API
    server to talk to and how to give one (exit 2), not the client's ConfigException."""
    done = subprocess.run(
        [KEELGATE, "operator", "--store", "postgresql://keelgate@127.0.0.1:1/keelgate"],
        cwd=tmp_path,
        env={**user_env(HOME=str(tmp_path)), "KUBECONFIG": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "no Kubernetes API server to talk to" in line and "KUBECONFIG" in line


def test_an_unreachable_temporal_server_is_one_line_with_its_reason(tmp_path: Path) -> None:
    """`keelgate temporal status` with nobody at --address: exit 5, one line ending in the
    reason a person reads (connection refused), not the Rust client's debug dump."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = keelgate(tmp_path, "temporal", "status", "restock", "--address", f"127.0.0.1:{port}")
    assert done.returncode == 5
    (line,) = done.stderr.splitlines()
    assert "cannot be reached: connection refused" in line
    assert "tonic" not in line and "Os {" not in line


def test_a_rerun_with_an_edited_manifest_of_a_finished_run_says_the_edit_was_not_used(
    folder: Path,
) -> None:
    """Run to its goal, edit the manifest, run again: one warning saying the run has finished,
    the change is not used, and what would run it (another metadata.name)."""
    assert keelgate(folder, "run", "-f", "run.yaml").returncode == 0
    (folder / "run.yaml").write_text(manifest().replace("goal: restock", "goal: restock more"))
    again = keelgate(folder, "run", "-f", "run.yaml")
    assert again.returncode == 0
    (line,) = [x for x in again.stderr.splitlines() if x.startswith("keelgate: warning:")]
    assert "the change is not used" in line and "metadata.name" in line


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("budget: {maxIterations: 10000, tokens: 50000}", "spec.budget.timeoutSeconds"),
        ("    name: demo\n", "spec.model.maxOutputTokens"),
    ],
)
def test_manifest_errors_are_worded_by_keelgate_not_by_its_validation_library(
    folder: Path, change: str, field: str
) -> None:
    """Values the validation library words itself (a number that is not finite, a number
    below its least) read as the rest: the field, then "must ..."."""
    replaced = {
        "spec.budget.timeoutSeconds": "budget: {timeoutSeconds: .inf}",
        "spec.model.maxOutputTokens": "    name: demo\n    maxOutputTokens: 0\n",
    }[field]
    (folder / "run.yaml").write_text(manifest().replace(change, replaced))
    done = keelgate(folder, "run", "-f", "run.yaml")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"keelgate: error: {field}: must ")
    assert "Input should" not in line and "Value error" not in line


def test_every_environment_variable_the_package_reads_is_documented() -> None:
    """docs/environment.md names every variable the package reads: those it asks the
    environment for by name, the flags' variables, and the names kept in constants."""
    package = Path(__file__).resolve().parents[1] / "operator" / "keelgate"
    patterns = [
        r"environ(?:\.get)?\(\s*\"([A-Z][A-Z0-9_]+)\"",
        r"environ\[\"([A-Z][A-Z0-9_]+)\"\]",
        r"getenv\(\"([A-Z][A-Z0-9_]+)\"",
        r"envvar=\"([A-Z][A-Z0-9_]+)\"",
        r"^[A-Z_]*ENV[A-Z_]* = \"([A-Z][A-Z0-9_]+)\"",
        r"^COMPLETE_VAR = \"([A-Z_][A-Z0-9_]+)\"",
        r"\"((?:OPENAI|ANTHROPIC)_API_KEY)\"",
    ]
    read: set[str] = set()
    for source in package.rglob("*.py"):
        text = source.read_text()
        for pattern in patterns:
            read.update(re.findall(pattern, text, re.MULTILINE))
    assert {"KEELGATE_STORE", "KEELGATE_DEBUG", "KEELGATE_PRICING", "OPENAI_API_KEY"} <= read
    documented = (package.parents[1] / "docs" / "environment.md").read_text()
    assert sorted(name for name in read if f"`{name}`" not in documented) == []


def test_shell_completion_offers_commands_flags_formats_and_the_stores_runs(
    folder: Path,
) -> None:
    """`source <(keelgate completion bash)`, then TAB: `keelgate ru` offers run and runs,
    `keelgate status ` the runs in the store, `keelgate audit ` export, verify and the runs,
    `keelgate runs -o ` the formats (zsh and fish get their own scripts)."""
    assert keelgate(folder, "run", "-f", "run.yaml").returncode == 0
    script = textwrap.dedent("""\
        source <(keelgate completion bash)
        words() {
            COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
            _keelgate_completion keelgate
            echo "${COMPREPLY[*]}"
        }
        words keelgate ru
        words keelgate status ""
        words keelgate audit ""
        words keelgate runs -o ""
        """)
    env = user_env(PATH=f"{Path(KEELGATE).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        ["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.splitlines() == [
        "run runs",
        "restock",
        "export verify restock",
        "text wide json yaml name",
    ], done.stderr
    for shell in ("zsh", "fish"):
        assert "_KEELGATE_COMPLETE" in keelgate(folder, "completion", shell).stdout
