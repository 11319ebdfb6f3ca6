"""The image without a Docker engine: the Dockerfile parsed, the build context it gets, and the
wheel its builder stage makes, installed the way its final stage installs it.

``docker build`` cannot run on the machines the tests run on, so the tests take the image apart:
``parse_dockerfile`` reads the Dockerfile with ``dockerfile-parse`` (for the lint rules of
``test_dockerfile.py``); ``stage_context`` copies what the builder stage's ``COPY`` lines take,
through ``.dockerignore``, into a folder; ``build_wheel`` runs the builder's ``pip wheel`` there;
``image_venv`` makes the final stage's virtual environment (no pip, wheels only, the ``postgres``
extra). What is slow is kept under ``.cache/image-test``: a wheelhouse keyed by what
pyproject.toml asks for, and the installed environment keyed by the wheel's contents (reused
only while its files are exactly as the install left them), so a warm run needs no network.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CACHE = ROOT / ".cache" / "image-test"
WHEELHOUSE_MAX_AGE = 7 * 24 * 3600  # then re-download: a new release of a dependency shows


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# -- the Dockerfile ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    name: str  # upper case: FROM, RUN, COPY, ...
    value: str  # as written, continuation lines joined
    line: int  # 1-based

    def tokens(self) -> list[str]:
        return shlex.split(self.value)

    def flags(self) -> dict[str, str]:
        """``--from=builder`` -> ``{"from": "builder"}`` (COPY, ADD, RUN flags)."""
        found = {}
        for token in self.tokens():
            if not token.startswith("--"):
                break
            name, _, value = token[2:].partition("=")
            found[name] = value
        return found

    def arguments(self) -> list[str]:
        """The tokens after the flags."""
        tokens = self.tokens()
        while tokens and tokens[0].startswith("--"):
            tokens.pop(0)
        return tokens

    def exec_form(self) -> list[str] | None:
        """The JSON array of ``ENTRYPOINT ["a", "b"]``; None for the shell form."""
        try:
            parsed = json.loads(self.value)
        except json.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, list) else None


@dataclass
class Stage:
    base: str  # the FROM image (or an earlier stage's name)
    alias: str  # "" when unnamed
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def named(self, name: str) -> list[Instruction]:
        return [i for i in self.instructions if i.name == name]

    def last(self, name: str) -> Instruction | None:
        found = self.named(name)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    stages: list[Stage]
    labels: dict[str, str]  # the final stage's, ARG defaults substituted
    envs: dict[str, str]  # the final stage's

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage_names(self) -> set[str]:
        return {s.alias for s in self.stages if s.alias}


def parse_dockerfile(text: str) -> Dockerfile:
    """The Dockerfile's stages and instructions, as dockerfile-parse reads them."""
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    stages: list[Stage] = []
    for item in parser.structure:
        name = item["instruction"].upper()
        if name == "COMMENT":
            continue
        instruction = Instruction(name, item["value"], item["startline"] + 1)
        if name == "FROM":
            words = instruction.arguments()
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(words[0], alias, instruction.line))
        if not stages:
            continue  # an ARG before the first FROM
        stages[-1].instructions.append(instruction)
    return Dockerfile(stages, dict(parser.labels), dict(parser.envs))


def commands(run: Instruction) -> Iterator[list[str]]:
    """The simple commands of a RUN line (split at ``&&``, ``||``, ``;``), as tokens."""
    lexer = shlex.shlex(run.value, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    current: list[str] = []
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            if current:
                yield current
            current = []
        else:
            current.append(token)
    if current:
        yield current


def pip_subcommand(tokens: list[str]) -> tuple[str, list[str]] | None:
    """For ``python -m pip [--opt V] install ARGS`` (or ``pip``, ``.../bin/pip3``):
    ``("install", ARGS)``; None when the command is not pip."""
    for at, token in enumerate(tokens):
        program = token.rsplit("/", 1)[-1]
        is_pip = re.fullmatch(r"pip3?(\.\d+)?", program) is not None
        if is_pip and (at == 0 or tokens[at - 1] == "-m"):
            rest = tokens[at + 1 :]
            for index, word in enumerate(rest):
                if word in {"install", "wheel", "download", "uninstall"}:
                    return word, rest[index + 1 :]
            return "", rest
    return None


# -- .dockerignore -------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's .dockerignore pattern (Go's filepath.Match, plus ``**``) as a regex."""
    out, at = [], 0
    while at < len(pattern):
        char = pattern[at]
        if pattern.startswith("**/", at):
            out.append("(?:.*/)?")
            at += 3
            continue
        if pattern.startswith("**", at):
            out.append(".*")
            at += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.index("]", at)
            body = pattern[at + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            at = end
        else:
            out.append(re.escape(char))
        at += 1
    return re.compile("".join(out))


def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, pattern) per line, in order; the last rule that matches a path decides."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((not keep, _pattern_regex(pattern)))
    return rules


def ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the build context leaves out ``path`` (relative, '/'-separated): a rule matches a
    path when it matches the path or one of its parent folders, as Docker's does."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for excludes, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            verdict = excludes
    return verdict


def _may_hold_kept(folder: str, text: str) -> bool:
    """Whether a '!' rule could bring back something under ``folder`` (an ignored folder that
    none could is not walked: .venv, .git and the caches are large)."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("!"):
            continue
        literal = re.split(r"[*?\[]", line[1:].strip().lstrip("/"), maxsplit=1)[0]
        if not literal or literal.startswith(folder + "/") or (folder + "/").startswith(literal):
            return True
    return False


def context_files(root: Path = ROOT) -> list[str]:
    """Every file under ``root`` the build context holds (relative paths)."""
    text = (root / ".dockerignore").read_text()
    rules = dockerignore_rules(text)
    kept = []
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root).as_posix()
        rel = "" if rel == "." else rel + "/"
        dirs[:] = [d for d in dirs if not ignored(rel + d, rules) or _may_hold_kept(rel + d, text)]
        kept += [rel + name for name in files if not ignored(rel + name, rules)]
    return sorted(kept)


# -- the builder stage ---------------------------------------------------------------------------


def builder_stage(dockerfile: Dockerfile) -> Stage:
    """The stage the final stage copies its wheel from."""
    for instruction in dockerfile.final.named("COPY"):
        source = instruction.flags().get("from")
        if source:
            return next(s for s in dockerfile.stages if s.alias == source)
    raise AssertionError("the final stage copies nothing from another stage")


def stage_context(dockerfile: Dockerfile, into: Path) -> Path:
    """Copy what the builder stage's COPY lines take from the build context into ``into``, as
    Docker would (sources through .dockerignore); refuses forms this emulation does not know."""
    kept = set(context_files())
    for instruction in builder_stage(dockerfile).named("COPY"):
        if instruction.flags():
            raise AssertionError(f"line {instruction.line}: COPY flags are not emulated here")
        *sources, dest = instruction.arguments()
        if not dest.endswith("/"):
            raise AssertionError(f"line {instruction.line}: COPY to a folder ending in '/'")
        for source in sources:
            source = source.rstrip("/")
            if any(c in source for c in "*?["):
                raise AssertionError(f"line {instruction.line}: wildcards are not emulated here")
            files = [f for f in kept if f == source or f.startswith(source + "/")]
            if not files:
                raise AssertionError(f"line {instruction.line}: {source} is not in the context")
            for name in files:
                # A file lands in dest by its name; a folder's contents land in dest.
                inner = Path(name).name if name == source else name[len(source) + 1 :]
                target = into / dest / inner
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, target)
    return into


def _pip(*args: str, cwd: Path | None = None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"pip {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


def wheelhouse() -> Path:
    """A folder of wheels: the build backend pyproject.toml names and, once ``fill_wheelhouse``
    ran, every dependency of ``keelgate[postgres,tracing]``. Keyed by what pyproject.toml asks
    for, this Python and this platform; downloaded again when older than a week."""
    project = pyproject()
    wanted = {
        "build": project["build-system"]["requires"],
        "dependencies": project["project"]["dependencies"],
        "extras": project["project"]["optional-dependencies"],
        "python": sys.version_info[:2],
        "platform": sysconfig.get_platform(),
    }
    key = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]
    house = CACHE / f"wheelhouse-{key}"
    stamp = house / ".build-stamp"
    fresh = stamp.exists() and time.time() - stamp.stat().st_mtime < WHEELHOUSE_MAX_AGE
    if not fresh:
        for old in CACHE.glob("wheelhouse-*"):
            _remove(old)
        house.mkdir(parents=True)
        _pip("download", "--only-binary=:all:", "--dest", str(house), *wanted["build"])
        stamp.touch()
    return house


def build_wheel(context: Path, out: Path) -> Path:
    """The builder stage's ``pip wheel --no-deps``, with the build backend from the wheelhouse
    (no network when warm). Returns the one wheel made."""
    house = wheelhouse()
    _pip(
        "wheel",
        "--no-deps",
        "--no-index",
        "--find-links",
        str(house),
        "--wheel-dir",
        str(out),
        str(context),
    )
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, f"the build made {wheels}"
    return wheels[0]


def fill_wheelhouse(wheel: Path, extras: str) -> Path:
    """The wheelhouse with every dependency of ``wheel[extras]`` as a wheel (pip refuses a
    dependency that comes only as source: the final stage has no compiler to build it)."""
    house = wheelhouse()
    stamp = house / f".deps-stamp-{extras}"
    if not stamp.exists():
        _pip("download", "--only-binary=:all:", "--dest", str(house), _with(wheel, extras))
        for ours in house.glob("keelgate-*.whl"):
            ours.unlink()  # only the wheel under test is ever installed
        stamp.touch()
    return house


def image_extras() -> str:
    """The extras the Dockerfile's final stage installs keelgate with (``operator,...``)."""
    match = re.search(r"\.whl\)\[([^\]]*)\]", DOCKERFILE.read_text())
    assert match is not None, "the Dockerfile installs keelgate without extras"
    return match.group(1)


def _with(wheel: Path, extras: str) -> str:
    return f"{wheel}[{extras}]" if extras else str(wheel)


def _slug(extras: str) -> str:
    # One cached venv per set of extras: the base install and the image's live side by side.
    return hashlib.sha256(extras.encode()).hexdigest()[:6] if extras else "base"


def snapshot(path: Path) -> dict[str, list[int]]:
    """Every file and folder under ``path`` with its size and mtime: what a write changes."""
    found = {}
    for folder, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            target = Path(folder, name)
            info = target.lstat()
            found[target.relative_to(path).as_posix()] = [info.st_size, info.st_mtime_ns]
    return found


def set_writable(path: Path, on: bool) -> None:
    """Give or take the write bits of everything under ``path`` (symlinks are left alone)."""
    subprocess.run(["chmod", "-R", "u+w" if on else "a-w", str(path)], check=True)


def _remove(path: Path) -> None:
    if path.is_dir():
        set_writable(path, True)
        shutil.rmtree(path)
    path.unlink(missing_ok=True)


def image_venv(wheel: Path, extras: str) -> Path:
    """The final stage's environment: ``python -m venv --without-pip``, then the outer pip
    installs ``wheel[extras]`` into it from wheels only.

    It is kept under .cache/ for the next run, keyed by the wheel's contents and the wheels
    installed with it, together with a snapshot of its files: it is reused only while it is
    exactly what the install left (any write since, and it is installed afresh)."""
    house = fill_wheelhouse(wheel, extras)
    digest = hashlib.sha256(f"{extras} {sys.version} {sorted(os.listdir(house))}".encode())
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + b"\0" + archive.read(name))
    key = digest.hexdigest()[:16]
    name = f"venv-{_slug(extras)}-{key}"
    venv, files = CACHE / name, CACHE / f"{name}.files.json"
    if venv.is_dir() and files.is_file() and json.loads(files.read_text()) == snapshot(venv):
        set_writable(venv, True)
        return venv
    for old in CACHE.glob(f"venv-{_slug(extras)}-*"):
        _remove(old)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _pip(
        "--python",
        str(venv / "bin" / "python"),
        "install",
        "--no-index",
        "--find-links",
        str(house),
        "--only-binary=:all:",
        _with(wheel, extras),
    )
    files.write_text(json.dumps(snapshot(venv)))
    return venv
