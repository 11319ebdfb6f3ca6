"""The Dockerfile keeps its promises, checked without a Docker engine: parsed with
dockerfile-parse, it is held to rules that make the image what step pods and the docs expect
(multi-stage, uid 65532, no compilers, pinned bases, the keelgate entrypoint, the wheel only,
the postgres extra, the Python pyproject.toml asks for, nothing written outside /tmp).

Each rule is also shown to fail: a mutation of the real Dockerfile that breaks the rule (and
only it, as far as the mutation goes) must make that rule report it. A rule that cannot fail
proves nothing. The build context (.dockerignore) is checked the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from keelgate.kube.resources import STEP_USER, StepPodSettings
from support.image import (
    DOCKERFILE,
    Dockerfile,
    Stage,
    builder_stage,
    commands,
    context_files,
    dockerignore_rules,
    ignored,
    parse_dockerfile,
    pip_subcommand,
    pyproject,
)

Rule = Callable[[Dockerfile], list[str]]
RULES: dict[str, Rule] = {}

#: Packages that build native code: none may be installed in the final stage.
#: What the image's operator and step pods need (pyproject's extras, docs/install.md).
IMAGE_EXTRAS = {"operator", "openai", "anthropic", "mcp", "postgres"}
BUILD_TOOLS = {
    "build-essential", "gcc", "g++", "cc", "c++", "clang", "make", "cmake", "binutils",
    "autoconf", "automake", "libtool", "pkg-config", "pkgconf", "rustc", "cargo", "git",
}  # fmt: skip
INSTALLERS = {"apt-get", "apt", "apk", "yum", "dnf", "microdnf"}


def rule(function: Rule) -> Rule:
    RULES[function.__name__] = function
    return function


def _image_stages(dockerfile: Dockerfile) -> list[Stage]:
    """The stages that start from an image, not from an earlier stage."""
    names: set[str] = set()
    found = []
    for stage in dockerfile.stages:
        if stage.base not in names:
            found.append(stage)
        if stage.alias:
            names.add(stage.alias)
    return found


def _python_minor(image: str) -> str | None:
    match = re.fullmatch(r"(?:[\w.\-/]+/)?python:(\d+\.\d+)(?:\.\d+)?(?:-[\w.\-]+)?(?:@.+)?", image)
    return match.group(1) if match else None


def _pip_installs(stage: Stage) -> list[list[str]]:
    found = []
    for run in stage.named("RUN"):
        for tokens in commands(run):
            pip = pip_subcommand(tokens)
            if pip and pip[0] == "install":
                found.append(pip[1])
    return found


def _keelgate_requirement(args: list[str]) -> str | None:
    return next((a for a in args if "keelgate" in a and not a.startswith("-")), None)


@rule
def multi_stage(d: Dockerfile) -> list[str]:
    """A builder stage makes the wheel; the final stage starts afresh from an image."""
    problems = []
    if len(d.stages) < 2:
        problems.append("one stage: the wheel must be built in a stage of its own")
    if d.final.base in {s.alias for s in d.stages[:-1] if s.alias}:
        problems.append(f"the final stage starts from stage {d.final.base!r} (its build tools)")
    return problems


@rule
def runs_as_the_step_user(d: Dockerfile) -> list[str]:
    """The final stage's last USER is numeric uid:gid 65532 (what step pods run as; a numeric
    user lets Kubernetes' runAsNonRoot check it)."""
    user = d.final.last("USER")
    if user is None:
        return ["no USER: the image would run as root"]
    match = re.fullmatch(r"(\d+)(?::(\d+))?", user.value.strip())
    if not match:
        return [f"USER {user.value}: not numeric (runAsNonRoot cannot verify a name)"]
    uid, gid = int(match.group(1)), int(match.group(2) or match.group(1))
    if uid == 0 or (uid, gid) != (STEP_USER, STEP_USER):
        return [f"USER {user.value}: step pods run as {STEP_USER}:{STEP_USER}"]
    return []


@rule
def no_build_tools_in_the_final_stage(d: Dockerfile) -> list[str]:
    """The final stage installs no compiler or -dev package (wheels need none)."""
    problems = []
    for run in d.final.named("RUN"):
        for tokens in commands(run):
            if not tokens or tokens[0] not in INSTALLERS:
                continue
            if not {"install", "add"} & set(tokens):
                continue
            for package in (t for t in tokens[1:] if not t.startswith("-")):
                name = package.split("=")[0]
                native = re.sub(r"-\d+$", "", name) in BUILD_TOOLS or name.endswith("-dev")
                if native:
                    problems.append(f"line {run.line}: installs {name}")
    return problems


@rule
def pinned_base_images(d: Dockerfile) -> list[str]:
    """Every base image names a tag that is not 'latest' (or a digest)."""
    problems = []
    for stage in _image_stages(d):
        image = stage.base
        if "@sha256:" in image:
            continue
        name, _, tag = image.rpartition(":")
        if not name or "/" in tag or tag in {"", "latest"}:
            problems.append(f"line {stage.line}: {image} is not pinned to a tag")
    return problems


@rule
def python_matches_pyproject(d: Dockerfile) -> list[str]:
    """Every stage runs the same Python minor version, and pyproject's requires-python takes
    it (the wheel is built and run by the one Python the package supports)."""
    wanted = SpecifierSet(pyproject()["project"]["requires-python"])
    minors = {stage.base: _python_minor(stage.base) for stage in _image_stages(d)}
    problems = [f"{image}: not an official python image" for image, m in minors.items() if not m]
    versions = {m for m in minors.values() if m}
    if len(versions) > 1:
        problems.append(f"stages run different Pythons: {sorted(versions)}")
    problems += [f"Python {v} is not {wanted}" for v in versions if Version(v) not in wanted]
    return problems


@rule
def entrypoint_is_keelgate(d: Dockerfile) -> list[str]:
    """ENTRYPOINT ["keelgate"] (exec form), the script pyproject installs and the program the
    operator starts step pods with; CMD ["operator"] is the operator itself."""
    scripts = pyproject()["project"]["scripts"]
    program = StepPodSettings().command[0]
    entry, cmd = d.final.last("ENTRYPOINT"), d.final.last("CMD")
    problems = []
    if entry is None or entry.exec_form() != [program] or program not in scripts:
        problems.append(f"ENTRYPOINT must be [{program!r}] in exec form")
    if cmd is None or cmd.exec_form() != ["operator"]:
        problems.append('CMD must be ["operator"] in exec form')
    return problems


@rule
def copies_the_wheel_only(d: Dockerfile) -> list[str]:
    """The final stage takes nothing from the build context and only wheels from other stages
    (no sources, no build tree)."""
    problems = []
    for copy in d.final.named("COPY") + d.final.named("ADD"):
        sources = copy.arguments()[:-1]
        if "from" not in copy.flags():
            problems.append(f"line {copy.line}: copies {sources} from the build context")
        elif not all(s.endswith(".whl") for s in sources):
            problems.append(f"line {copy.line}: copies {sources}, not only the wheel")
    if not any("from" in c.flags() for c in d.final.named("COPY")):
        problems.append("the final stage copies no wheel from the builder")
    return problems


@rule
def builder_makes_the_wheel_alone(d: Dockerfile) -> list[str]:
    """The builder's pip wheel runs with --no-deps: the wheel folder holds keelgate alone."""
    for run in builder_stage(d).named("RUN"):
        for tokens in commands(run):
            pip = pip_subcommand(tokens)
            if pip and pip[0] == "wheel":
                return [] if "--no-deps" in pip[1] else [f"line {run.line}: pip wheel: --no-deps"]
    return ["the builder runs no pip wheel"]


@rule
def pip_keeps_no_cache(d: Dockerfile) -> list[str]:
    """Every pip install and pip wheel says --no-cache-dir (no cache left in a layer)."""
    problems = []
    for stage in d.stages:
        for run in stage.named("RUN"):
            for tokens in commands(run):
                pip = pip_subcommand(tokens)
                if pip and pip[0] in {"install", "wheel"} and "--no-cache-dir" not in tokens:
                    problems.append(f"line {run.line}: pip {pip[0]} without --no-cache-dir")
    return problems


@rule
def installs_wheels_only(d: Dockerfile) -> list[str]:
    """The final stage's pip install takes wheels only: with no compiler there, a dependency
    that came as source would fail to build (better to say so in one line)."""
    installs = _pip_installs(d.final)
    bad = [args for args in installs if "--only-binary=:all:" not in args]
    return [f"pip install {' '.join(a)}: --only-binary=:all:" for a in bad] or (
        [] if installs else ["the final stage runs no pip install"]
    )


@rule
def installs_the_image_extras(d: Dockerfile) -> list[str]:
    """keelgate is installed with the extras the image's two programs need: the operator's
    (kopf), postgres (the operator refuses any other store), and every model provider and MCP
    (a step pod runs whatever the AgentRun names); each one pyproject declares."""
    extras = pyproject()["project"]["optional-dependencies"]
    for args in _pip_installs(d.final):
        requirement = _keelgate_requirement(args)
        if requirement is None:
            continue
        match = re.search(r"\[([^\]]*)\]$", requirement)
        named = {e.strip() for e in match.group(1).split(",")} if match else set()
        lacking = sorted(IMAGE_EXTRAS - named)
        if lacking:
            return [f"{requirement}: without the extras {', '.join(lacking)}"]
        return [f"{requirement}: no extra {e!r} in pyproject" for e in named - set(extras)]
    return ["no pip install of keelgate in the final stage"]


@rule
def runtime_writes_only_tmp(d: Dockerfile) -> list[str]:
    """HOME and the working folder are /tmp (the one writable place in a step pod),
    PYTHONDONTWRITEBYTECODE=1, and PATH leads to the keelgate the final stage installed."""
    problems = []
    for name, value in {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}.items():
        if d.envs.get(name) != value:
            problems.append(f"ENV {name}={d.envs.get(name)!r}, not {value!r}")
    workdir = d.final.last("WORKDIR")
    if workdir is None or workdir.value.strip() != "/tmp":
        problems.append("WORKDIR must be /tmp (relative paths, e.g. the default store, land there)")
    venvs = [
        t[t.index("venv") + 1 :]
        for run in d.final.named("RUN")
        for t in commands(run)
        if "venv" in t and t[t.index("venv") - 1] == "-m"
    ]
    targets = [next(a for a in args if not a.startswith("-")) for args in venvs if args]
    path = d.envs.get("PATH", "")
    if not any(path.startswith(f"{target}/bin:") for target in targets):
        problems.append(f"PATH {path!r} does not start with the venv's bin ({targets})")
    return problems


@rule
def oci_labels(d: Dockerfile) -> list[str]:
    """The OCI labels say what the image is: title, description, revision, the version and
    license pyproject.toml states, and the source the Helm chart names as its home."""
    project = pyproject()["project"]
    chart = yaml.safe_load((DOCKERFILE.parent / "charts" / "keelgate" / "Chart.yaml").read_text())
    wanted = {
        "org.opencontainers.image.version": project["version"],
        "org.opencontainers.image.licenses": project["license"],
        "org.opencontainers.image.title": "keelgate",
        "org.opencontainers.image.source": chart["home"],
    }
    problems = [
        f"LABEL {k}={d.labels.get(k)!r}, not {v!r}"
        for k, v in wanted.items()
        if d.labels.get(k) != v
    ]
    for key in ("org.opencontainers.image.description", "org.opencontainers.image.revision"):
        if not d.labels.get(key):
            problems.append(f"LABEL {key} is missing")
    return problems


@rule
def no_healthcheck(d: Dockerfile) -> list[str]:
    """No HEALTHCHECK: Kubernetes ignores it; the operator's probes use /healthz and /readyz,
    and a step pod has nothing to probe."""
    return [f"line {h.line}: HEALTHCHECK" for s in d.stages for h in s.named("HEALTHCHECK")]


def real() -> str:
    return DOCKERFILE.read_text()


def test_every_rule_is_checked() -> None:
    """The rules below are the ones the mutations exercise: a rule added without a mutation
    that breaks it fails here."""
    assert set(RULES) == {r for r, _ in MUTATIONS}


@pytest.mark.parametrize("name", sorted(RULES))
def test_the_dockerfile_keeps_the_rule(name: str) -> None:
    """The Dockerfile as committed breaks none of the rules."""
    assert RULES[name](parse_dockerfile(real())) == []


def _swap(old: str, new: str) -> Callable[[str], str]:
    def mutate(text: str) -> str:
        assert old in text, f"the mutation's text {old!r} is no longer in the Dockerfile"
        return text.replace(old, new)

    return mutate


def _append(lines: str) -> Callable[[str], str]:
    return lambda text: text + lines


FINAL_FROM = "FROM python:3.11-slim-bookworm\n"
_EXTRAS = ".whl)[operator,openai,anthropic,mcp,postgres,tracing]"
BUILDER_FROM = "FROM python:3.11-slim-bookworm AS builder\n"

MUTATIONS: list[tuple[str, Callable[[str], str]]] = [
    ("multi_stage", _swap(FINAL_FROM, "FROM builder\n")),
    ("multi_stage", lambda t: t[t.index(FINAL_FROM) :]),
    ("runs_as_the_step_user", _swap("USER 65532:65532", "USER keelgate")),
    ("runs_as_the_step_user", _swap("USER 65532:65532", "USER 0")),
    ("runs_as_the_step_user", _swap("USER 65532:65532", "USER 1000:1000")),
    ("runs_as_the_step_user", _swap("USER 65532:65532\n", "")),
    (
        "no_build_tools_in_the_final_stage",
        _append("RUN apt-get update && apt-get install -y --no-install-recommends gcc\n"),
    ),
    ("no_build_tools_in_the_final_stage", _append("RUN apt-get install -y libpq-dev\n")),
    ("pinned_base_images", _swap(BUILDER_FROM, "FROM python AS builder\n")),
    ("pinned_base_images", _swap(FINAL_FROM, "FROM python:latest\n")),
    ("python_matches_pyproject", _swap(FINAL_FROM, "FROM python:3.10-slim-bookworm\n")),
    ("python_matches_pyproject", _swap(BUILDER_FROM, "FROM python:3.12-slim AS builder\n")),
    ("python_matches_pyproject", _swap(FINAL_FROM, "FROM debian:bookworm-slim\n")),
    ("entrypoint_is_keelgate", _swap('ENTRYPOINT ["keelgate"]', "ENTRYPOINT keelgate")),
    ("entrypoint_is_keelgate", _swap('ENTRYPOINT ["keelgate"]', 'ENTRYPOINT ["python"]')),
    ("entrypoint_is_keelgate", _swap('CMD ["operator"]', 'CMD ["step"]')),
    ("copies_the_wheel_only", _append("COPY --from=builder /src /src\n")),
    ("copies_the_wheel_only", _append("COPY operator/ /opt/operator/\n")),
    ("builder_makes_the_wheel_alone", _swap("--no-deps \\\n", "\\\n")),
    ("pip_keeps_no_cache", _swap("install --no-cache-dir", "install")),
    ("pip_keeps_no_cache", _swap("wheel --no-cache-dir", "wheel")),
    ("installs_wheels_only", _swap(" --only-binary=:all:", "")),
    ("installs_the_image_extras", _swap(_EXTRAS, ".whl)")),
    ("installs_the_image_extras", _swap(_EXTRAS, ".whl)[langgraph]")),
    ("installs_the_image_extras", _swap(_EXTRAS, _EXTRAS.replace("postgres,", ""))),
    ("installs_the_image_extras", _swap(_EXTRAS, _EXTRAS.replace("operator,", ""))),
    ("installs_the_image_extras", _swap(_EXTRAS, _EXTRAS.replace("anthropic,", ""))),
    ("installs_the_image_extras", _swap(_EXTRAS, _EXTRAS.replace("postgres", "postgres,pg"))),
    ("runtime_writes_only_tmp", _swap("    PYTHONDONTWRITEBYTECODE=1 \\\n", "")),
    ("runtime_writes_only_tmp", _swap("HOME=/tmp", "HOME=/home/keelgate")),
    ("runtime_writes_only_tmp", _swap("WORKDIR /tmp", "WORKDIR /app")),
    ("runtime_writes_only_tmp", _swap('PATH="/opt/keelgate/bin:${PATH}"', 'PATH="/usr/bin"')),
    ("oci_labels", _swap("ARG VERSION=0.1.0", "ARG VERSION=0.0.9")),
    ("oci_labels", _swap('org.opencontainers.image.licenses="Apache-2.0"', 'x.y="z"')),
    ("oci_labels", _swap('org.opencontainers.image.revision="${REVISION}"', 'x.y="z"')),
    ("oci_labels", _swap("github.com/keelgate/keelgate", "example.com/keelgate")),
    ("no_healthcheck", _append("HEALTHCHECK CMD keelgate --version\n")),
]


@pytest.mark.parametrize(
    ("name", "mutate"), MUTATIONS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(MUTATIONS)]
)
def test_the_rule_fails_a_dockerfile_that_breaks_it(
    name: str, mutate: Callable[[str], str]
) -> None:
    """Each rule reports a Dockerfile changed to break it: the rule can fail."""
    text = real()
    mutated = mutate(text)
    assert mutated != text
    assert RULES[name](parse_dockerfile(mutated)) != []


# -- the build context ---------------------------------------------------------------------------

LEFT_OUT = [
    ".venv/bin/python",
    ".git/HEAD",
    "e2e/bin/kube-apiserver",
    ".dev/kubeconfig",
    ".keelgate/keelgate.db",
    ".cache/image-test/wheelhouse-0/x.whl",
    ".mypy_cache/3.11/x.json",
    ".ruff_cache/x",
    ".pytest_cache/v/x",
    ".hypothesis/examples/x",
    "operator/keelgate/__pycache__/cli.cpython-311.pyc",
    "operator/keelgate/cli/__pycache__/x.cpython-311.pyc",
    "operator/keelgate.egg-info/SOURCES.txt",
    "tests/data/full-agentrun.yaml",
    "docs/install.md",
    "examples/restock/agentrun.yaml",
    "build/lib/keelgate/__init__.py",
    "dist/keelgate-0.1.0-py3-none-any.whl",
]


@pytest.mark.parametrize("path", LEFT_OUT)
def test_the_build_context_leaves_out(path: str) -> None:
    """.dockerignore keeps local state, caches, secrets' likely homes, tests and docs out of
    the build context (so they never reach a layer, nor bust the build cache)."""
    rules = dockerignore_rules((DOCKERFILE.parent / ".dockerignore").read_text())
    assert ignored(path, rules)


def test_the_build_context_holds_what_the_builder_copies() -> None:
    """Every source the builder stage's COPY lines name is in the context, and the package's
    modules with it: the build cannot miss a file .dockerignore dropped."""
    files = context_files()
    for copy in builder_stage(parse_dockerfile(real())).named("COPY"):
        for source in copy.arguments()[:-1]:
            source = source.rstrip("/")
            assert any(f == source or f.startswith(source + "/") for f in files), source
    assert "operator/keelgate/py.typed" in files
    assert "operator/keelgate/cli/__init__.py" in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
