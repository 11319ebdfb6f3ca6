"""The program the image ships works as the image runs it, shown without a Docker engine.

The Dockerfile's builder stage is replayed (its COPY lines through .dockerignore, then
``pip wheel --no-deps``) and the wheel is installed the way the final stage installs it: into a
``venv --without-pip``, with the image's extras, from wheels only. Then the commands a
Kubernetes pod runs are run the way a step pod runs them: the installed files read-only (as
root, with every capability dropped, so write permission bits bind), HOME and the working
folder a writable scratch folder (the pod's /tmp emptyDir), PYTHONDONTWRITEBYTECODE=1. And
nothing is written under the installation even where it could be.

Downloads and the installed environment are kept under .cache/image-test (see
``support/image.py``): warm, the module runs offline in well under a minute.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from email.parser import HeaderParser
from pathlib import Path

import pytest
import yaml

from keelgate.cli import main
from keelgate.manifest import load_agentrun
from keelgate.stores import open_stores
from support.image import (
    DOCKERFILE,
    ROOT,
    build_wheel,
    image_extras,
    image_venv,
    parse_dockerfile,
    pyproject,
    set_writable,
    snapshot,
    stage_context,
)

VERSION = pyproject()["project"]["version"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the builder stage makes, from the context Docker would send."""
    base = tmp_path_factory.mktemp("image-build")
    context = stage_context(parse_dockerfile(DOCKERFILE.read_text()), base / "src")
    return build_wheel(context, base / "dist")


@pytest.fixture(scope="module")
def venv(wheel: Path) -> Path:
    """The final stage's /opt/keelgate (kept under .cache/ while it is what the install left)."""
    return image_venv(wheel, image_extras())


@pytest.fixture(scope="module")
def read_only(venv: Path) -> Iterator[list[str]]:
    """The installation's files without write permission, and the prefix that makes root obey
    it (setpriv drops every capability, CAP_DAC_OVERRIDE with them): a step pod's view, where
    uid 65532 may not write a file root installed. Module-wide: the tests that use it come last."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.fail("setpriv (util-linux) is needed to drop root's capabilities", False)
        prefix = [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]
    set_writable(venv, False)
    try:
        yield prefix
    finally:
        set_writable(venv, True)


def run_in_image(
    venv: Path,
    argv: list[str],
    home: Path,
    prefix: Sequence[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``argv`` as the image runs it: the image's PATH and environment (and ``environ``),
    nothing of ours."""
    env = {
        "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "LANG": "C.UTF-8",
        "COLUMNS": "200",
        **(environ or {}),
    }
    return subprocess.run(
        [*prefix, *argv],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


#: (id, argv, what its output must hold); "{venv}" is filled in.
COMMANDS = [
    ("version", ["keelgate", "--version"], f"keelgate {VERSION}"),
    ("operator-help", ["keelgate", "operator", "--help"], "--allow-failpoints"),
    ("step-help", ["keelgate", "step", "--help"], "--termination-log"),
    ("import", ["python", "-c", "import keelgate; print(keelgate.__file__)"], "{venv}/lib/"),
    (
        "operator-imports",
        [
            "python",
            "-c",
            "import keelgate.kube.runtime.operator, keelgate.runners.step, kopf, psycopg, "
            "psycopg_pool;"
            "print('libpq', psycopg.pq.__impl__)",
        ],
        "libpq binary",  # the wheel's own libpq: the slim image has none
    ),
]


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(parents=True)
    return home


def test_the_wheel_ships_the_package_with_py_typed_and_no_tests(wheel: Path) -> None:
    """The wheel holds every module of operator/keelgate (no subpackage lost), py.typed, the
    decision inbox's stylesheet and script, and nothing else: no tests, examples, e2e, caches
    or compiled files."""
    names = zipfile.ZipFile(wheel).namelist()
    package = [n for n in names if not n.startswith(f"keelgate-{VERSION}.dist-info/")]
    sources = {
        p.relative_to(ROOT / "operator").as_posix()
        for p in (ROOT / "operator" / "keelgate").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert "keelgate/py.typed" in package
    assert {n for n in package if n.endswith(".py")} == sources
    static = {
        p.relative_to(ROOT / "operator").as_posix()
        for p in (ROOT / "operator" / "keelgate" / "cli" / "plugin" / "ui" / "static").iterdir()
    }
    assert static == {
        "keelgate/cli/plugin/ui/static/ui.css",
        "keelgate/cli/plugin/ui/static/ui.js",
    }
    assert set(package) == sources | {"keelgate/py.typed"} | static


def test_the_wheel_declares_the_entry_point_and_the_postgres_extra(wheel: Path) -> None:
    """The wheel's metadata is pyproject's: name, version, Python, the postgres extra, and the
    ``keelgate`` script the image's ENTRYPOINT runs."""
    archive = zipfile.ZipFile(wheel)
    info = f"keelgate-{VERSION}.dist-info"
    meta = HeaderParser().parsestr(archive.read(f"{info}/METADATA").decode())
    assert (meta["Name"], meta["Version"]) == ("keelgate", VERSION)
    assert meta["Requires-Python"] == pyproject()["project"]["requires-python"]
    assert "postgres" in meta.get_all("Provides-Extra", [])
    entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert "keelgate = keelgate.cli:run" in entry_points


def test_the_installation_has_no_build_tools_and_the_binary_driver(venv: Path) -> None:
    """What the final stage installs: keelgate, psycopg with its binary libpq, and no pip,
    setuptools or wheel (the venv is made --without-pip)."""
    site = next((venv / "lib").glob("python3.*/site-packages"))
    dists = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert {"keelgate", "psycopg", "psycopg_binary", "psycopg_pool", "kopf"} <= dists
    assert not dists & {"pip", "setuptools", "wheel"}


def test_running_writes_nothing_under_the_installation(venv: Path, tmp_path: Path) -> None:
    """Even where it could write (files writable, root's capabilities kept), running every
    command above leaves the installation as it was: no __pycache__, no cache, no state."""
    assert os.access(venv / "bin", os.W_OK)  # else a write would fail unseen, proving nothing
    before = snapshot(venv)
    for _, argv, _expected in COMMANDS:
        done = run_in_image(venv, argv, _home(tmp_path / str(len(os.listdir(tmp_path)))))
        assert done.returncode == 0, done.stderr
    after = snapshot(venv)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert changed == []


@pytest.mark.parametrize(
    ("argv", "expected"), [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS]
)
def test_the_commands_run_from_read_only_files(
    venv: Path, read_only: list[str], tmp_path: Path, argv: list[str], expected: str
) -> None:
    """keelgate --version, operator --help, step --help and the imports the operator and the
    postgres store need all work with the installation read-only, as in a step pod."""
    done = run_in_image(venv, argv, _home(tmp_path), read_only)
    assert done.returncode == 0, done.stderr
    assert expected.format(venv=venv) in done.stdout


RUN = """
apiVersion: keelgate.dev/v1alpha1
kind: AgentRun
metadata: {name: hello, namespace: shop}
spec:
  goal: "Say hello"
  model:
    provider: scripted
    name: demo
    script:
      - {done: true, answer: "hello", usage: {inputTokens: 10, outputTokens: 2}}
  budget: {maxIterations: 2}
"""


@pytest.mark.postgres
def test_a_step_runs_from_read_only_files_against_postgresql(
    venv: Path, read_only: list[str], tmp_path: Path, pg_url: str
) -> None:
    """``keelgate step`` as a step pod runs it (read-only installation, HOME a scratch folder,
    the store a PostgreSQL URL): it reads the spec the operator recorded, runs the step, exits
    0, writes the termination message, and the store holds the finished run."""
    spec = load_agentrun(RUN).to_loop_spec()
    stores = open_stores(pg_url)
    try:
        assert stores.specs is not None
        stores.specs.record_spec("shop", "hello", spec.to_json(), source="uid-1", generation=1)
    finally:
        stores.close()
    home = _home(tmp_path)
    termination = home / "termination-log"
    termination.touch()
    argv = ["keelgate", "step", "-n", "shop", "--run", "hello", "--store", pg_url]
    done = run_in_image(venv, [*argv, "--termination-log", str(termination)], home, read_only)
    assert done.returncode == 0, done.stdout + done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert (outcome["phase"], outcome["stopReason"]) == ("Succeeded", "goal_met")
    assert json.loads(termination.read_text()) == outcome
    assert main(["status", "hello", "-n", "shop", "--store", pg_url]) == 0  # the store says so


@pytest.fixture(scope="module")
def base_venv(wheel: Path) -> Path:
    """``pip install keelgate`` with no extra: the plugin's install (docs/plugin.md)."""
    return image_venv(wheel, "")


def test_make_demo_local_runs_on_the_base_install_it_makes(base_venv: Path, tmp_path: Path) -> None:
    """`make demo-local` installs keelgate with no extra, and its demo needs no more: run on the
    base install alone, the process is killed after the order, the run stops outcome_unknown, is
    settled and resumed, and the shop has one order."""
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndemo-local: $(BASE_STAMP)\n" in makefile
    assert "$(BASE_STAMP): pyproject.toml | check-python\n\t$(call install,," in makefile
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "examples" / "restock", checkout / "examples" / "restock")
    home = _home(tmp_path)
    done = run_in_image(base_venv, ["python", str(checkout / "examples/restock/demo.py")], home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outcome_unknown" in done.stdout
    book = checkout / ".keelgate" / "demo" / "shop" / "orders.jsonl"
    assert len(book.read_text().splitlines()) == 1


def test_the_base_install_is_the_plugin_without_the_operator_or_providers(
    base_venv: Path, tmp_path: Path
) -> None:
    """``pip install keelgate`` brings the plugin and the library but no kopf, nor the
    Prometheus client, a model SDK or MCP: the plugin answers, the scripted restock runs to its
    end, and the operator and the providers each say in one line which extra brings them."""
    site = next((base_venv / "lib").glob("python3.*/site-packages"))
    dists = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert {"keelgate", "kubernetes", "pydantic", "typer"} <= dists
    heavy = {"kopf", "prometheus_client", "cloudevents", "openai", "anthropic", "mcp", "psycopg"}
    assert not dists & heavy, dists & heavy
    home = _home(tmp_path)

    helped = run_in_image(base_venv, ["kubectl-keelgate", "--help"], home)
    assert helped.returncode == 0 and "pending" in helped.stdout, helped.stderr
    inbox = run_in_image(base_venv, ["kubectl-keelgate", "ui", "--help"], home)
    assert inbox.returncode == 0 and "--port" in inbox.stdout, inbox.stderr
    assets = run_in_image(
        base_venv,
        [
            "python",
            "-c",
            "from importlib import resources; s = resources.files('keelgate.cli.plugin.ui');"
            "print(all(s.joinpath('static', n).read_bytes() for n in ('ui.css', 'ui.js')))",
        ],
        home,
    )
    assert assets.stdout.strip() == "True", assets.stderr  # the inbox's page needs both
    completion = run_in_image(base_venv, ["kubectl_complete-keelgate", "pen"], home)
    assert completion.returncode == 0 and "pending" in completion.stdout, completion.stderr

    operator = run_in_image(
        base_venv, ["keelgate", "operator", "--store", "postgresql://u@127.0.0.1/db"], home
    )
    lines = operator.stderr.strip().splitlines()
    assert operator.returncode != 0 and len(lines) == 1, operator.stderr
    assert "pip install 'keelgate[operator]'" in lines[0], lines

    for file in ("agentrun.yaml", "shop.py"):
        shutil.copy(ROOT / "examples" / "restock" / file, home / file)
    ran = run_in_image(base_venv, ["keelgate", "run", "-f", "agentrun.yaml", "-o", "json"], home)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["stopReason"] == "goal_met"

    manifest = (home / "agentrun.yaml").read_text()
    model = manifest[manifest.index("  model:") : manifest.index("  tools:")]
    openai = "  model:\n    provider: openai\n    name: gpt-5\n    baseURL: http://127.0.0.1:9\n"
    (home / "openai.yaml").write_text(manifest.replace(model, openai))
    refused = run_in_image(base_venv, ["keelgate", "run", "-f", "openai.yaml"], home)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1, refused.stderr
    assert "spec.model.provider" in lines[0] and "pip install 'keelgate[openai]'" in lines[0]


#: An OTLP endpoint where nothing listens: set for every process, as many clusters set it.
OTEL = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
TRACING_MISSING = (
    "keelgate: warning: tracing (asked for by OTEL_EXPORTER_OTLP_ENDPOINT) needs the tracing "
    "extra: pip install 'keelgate[tracing]' (opentelemetry is not installed); going on without "
    "tracing"
)


def test_the_base_install_with_an_otlp_endpoint_runs_untraced_and_says_so_once(
    base_venv: Path, tmp_path: Path
) -> None:
    """``pip install keelgate`` (no tracing extra) in a shell where OTEL_EXPORTER_OTLP_ENDPOINT
    is set: the restock manifest runs to its end as without tracing, and stderr holds one line,
    the warning naming the extra to install; `status` and `audit` of the run, read the same
    way, also say it once each and answer as always."""
    home = _home(tmp_path)
    for file in ("agentrun.yaml", "shop.py"):
        shutil.copy(ROOT / "examples" / "restock" / file, home / file)
    ran = run_in_image(
        base_venv, ["keelgate", "run", "-f", "agentrun.yaml", "-o", "json"], home, environ=OTEL
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["stopReason"] == "goal_met"
    assert ran.stderr.strip().splitlines() == [TRACING_MISSING]
    assert len((home / ".keelgate/shop/orders.jsonl").read_text().splitlines()) == 1
    status = run_in_image(
        base_venv, ["keelgate", "status", "restock", "-n", "shop"], home, environ=OTEL
    )
    assert status.returncode == 0 and "goal_met" in status.stdout, status.stderr
    assert status.stderr.strip().splitlines() == [TRACING_MISSING]


def test_every_missing_extra_is_one_line_naming_it_with_exit_code_2(
    base_venv: Path, tmp_path: Path
) -> None:
    """On the base install, each thing an extra brings, asked for: one line on stderr naming
    the extra and its ``pip install``, exit 2 (bad input, as README's table says), never an
    internal error; nothing is run."""
    home = _home(tmp_path)
    manifest = (ROOT / "examples" / "restock" / "agentrun.yaml").read_text()
    shutil.copy(ROOT / "examples" / "restock" / "shop.py", home / "shop.py")
    (home / "agentrun.yaml").write_text(manifest)
    model = manifest[manifest.index("  model:") : manifest.index("  tools:")]
    anthropic = (
        "  model:\n    provider: anthropic\n    name: claude\n    baseURL: http://127.0.0.1:9\n"
    )
    (home / "anthropic.yaml").write_text(manifest.replace(model, anthropic))
    tool = '      python: {callable: "shop:place_order"}\n'
    mcp = "      mcp: {url: http://127.0.0.1:9/mcp, tool: place_order}\n"
    (home / "mcp.yaml").write_text(manifest.replace(tool, mcp))
    pg = "postgresql://keelgate@127.0.0.1:9/keelgate"
    cases = [
        (["keelgate", "run", "-f", "anthropic.yaml"], "anthropic", "spec.model.provider"),
        (["keelgate", "run", "-f", "mcp.yaml"], "mcp", "spec.tools[1].mcp"),
        (["keelgate", "run", "-f", "agentrun.yaml", "--store", pg], "postgres", "--store"),
        (["keelgate", "tenant", "list", "--store", pg], "postgres", ""),
        (
            ["keelgate", "run", "-f", "agentrun.yaml", "--store", "langgraph+sqlite:///lg.db"],
            "langgraph",
            "--store",
        ),
        (["keelgate", "temporal", "status", "restock"], "temporal", "keelgate temporal status"),
        (["keelgate", "operator", "--store", pg], "operator", "operator"),
    ]
    for argv, extra, field in cases:
        done = run_in_image(base_venv, argv, home)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (argv, done.stderr)
        assert f"pip install 'keelgate[{extra}]'" in lines[0], (argv, lines)
        assert lines[0].startswith(f"keelgate: error: {field}"), (argv, lines)
        assert "internal error" not in lines[0]
    assert not (home / ".keelgate/shop/orders.jsonl").exists()


#: The chart's settings whose feature an extra brings, by the value that turns it on.
CHART_SETTING_EXTRAS = {
    "store": "postgres",  # the operator's and the step pods' store is PostgreSQL
    "notifications.sinks": "operator",  # CloudEvents (the cloudevents package)
    "tracing.otlpEndpoint": "tracing",
}


def test_make_up_installs_every_extra_the_charts_documented_settings_need() -> None:
    """`make up`'s venv stands in for the image on its cluster (step pods and the operator run
    its `keelgate`): it holds the operator and every extra a documented chart setting turns on,
    so `helm upgrade ... --set tracing.otlpEndpoint=...` (docs/observability.md) works there."""
    makefile = (ROOT / "Makefile").read_text()
    up = re.search(r"^UP_EXTRAS\s*:=\s*(\S+)$", makefile, re.MULTILINE)
    assert up is not None and "\nup: $(UP_STAMP)\n" in makefile
    values = yaml.safe_load((ROOT / "charts" / "keelgate" / "values.yaml").read_text())
    for setting in CHART_SETTING_EXTRAS:
        node = values
        for part in setting.split("."):
            assert isinstance(node, dict) and part in node, f"{setting}: not a chart value"
            node = node[part]
    needed = {"operator", *CHART_SETTING_EXTRAS.values()}
    assert needed <= set(up.group(1).split(",")), up.group(1)
    assert needed <= set(image_extras().split(","))  # and the image, which the chart runs
