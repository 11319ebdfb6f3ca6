"""Find or build the control-plane binaries (kube-apiserver, controller-manager, scheduler, etcd),
helm, jaeger (the trace collector of the tracing tests), and krew with its manifest validator;
and, only when asked (`ensure_optional`), kwok for the scale bench.

Why it exists: no release binary can be downloaded here, so the programs are built from the Go
modules pinned in e2e/tools/up (what `make up` runs: the three Kubernetes commands, etcd and helm,
one module and one `go build`, so the packages they share compile once), e2e/tools/jaeger and
e2e/tools/krew (and e2e/tools/kwok, for the scale bench only), into the git-ignored folder
e2e/bin, with the version ldflags an official build sets. Callers name the programs they run
(`--for up` is what `make up` runs), so a cold `make up` never builds the tracing collector or
krew. Binaries on KUBEBUILDER_ASSETS (envtest's convention) or PATH are used instead when they
are new enough. Builds reuse Go's build and module caches, so only the first build on a machine
is slow; it shows how far it is (packages compiled of the total `go list` counted first).

It must never download anything but Go modules through the Go toolchain (no toolchain switch, no
release tarballs), and never write outside e2e/bin and Go's own caches.

Run as `python -m keelgate_e2e.build --for up|e2e` (`--force` rebuilds, `--print` only shows what
is used).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from keelgate_e2e import (
    ETCD_VERSION,
    HELM_VERSION,
    JAEGER_VERSION,
    KREW_VERSION,
    KUBE_VERSION,
    KWOK_VERSION,
)

E2E_DIR = Path(__file__).resolve().parent.parent
BIN_DIR = E2E_DIR / "bin"
UP_TOOLS = E2E_DIR / "tools" / "up"
JAEGER_TOOLS = E2E_DIR / "tools" / "jaeger"
KREW_TOOLS = E2E_DIR / "tools" / "krew"
KWOK_TOOLS = E2E_DIR / "tools" / "kwok"

KUBE_PROGRAMS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
KREW_PROGRAMS = ("kubectl-krew", "validate-krew-manifest")
#: What a cluster's start needs (`Cluster.start`).
CLUSTER_PROGRAMS = (*KUBE_PROGRAMS, "etcd")
#: What `make up` runs: the cluster, and helm to install Keelgate's chart. Not jaeger (the tracing
#: tests' collector) nor krew (the plugin's packaging tests): a cold build of those would add
#: minutes to `make demo` for programs it never starts.
UP_PROGRAMS = (*CLUSTER_PROGRAMS, "helm")
#: The main package of each program of e2e/tools/up, all built by one `go build`: one module
#: graph, so k8s.io/api, apimachinery, client-go, grpc, protobuf ... compile once for the five
#: (three modules of their own compiled them up to three times, at different versions).
UP_PACKAGES = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "etcd": "go.etcd.io/etcd/server/v3",
    "helm": "helm.sh/helm/v4/cmd/helm",
}
ALL_PROGRAMS = (*UP_PROGRAMS, "jaeger", *KREW_PROGRAMS)
#: The sets `python -m keelgate_e2e.build --for` names: `make up` builds `up`, the e2e suite `e2e`.
PROGRAM_SETS = {"up": UP_PROGRAMS, "e2e": ALL_PROGRAMS}
#: Built only by `ensure_optional` (the scale bench): never by `ensure`, `make up` or the tests.
OPTIONAL_PROGRAMS = ("kwok",)

#: Oldest releases accepted from KUBEBUILDER_ASSETS or PATH.
MIN_KUBE = (1, 36, 0)
MIN_ETCD = (3, 6, 0)
MIN_HELM = (4, 2, 0)
MIN_JAEGER = (1, 75, 0)
MIN_KREW = (0, 4, 3)
MIN_KWOK = (0, 8, 0)
#: Oldest Go that can build the pinned modules (their go.mod says `go 1.26.0`).
MIN_GO = (1, 26, 0)
#: Flags of every build, besides the programs' -ldflags: paths trimmed as in official builds; no
#: debug information compiled, which the linker's `-w` would drop anyway (it costs about a tenth
#: of the compile's CPU).
GO_FLAGS = ("-trimpath", "-gcflags=all=-dwarf=false")
#: The standard library's packages that import all the others `make up`'s programs use (from
#: `go list -deps` of UP_PACKAGES with Go 1.26), compiled while the modules download.
STD_ROOTS = (
    "archive/tar", "archive/zip", "compress/bzip2", "compress/zlib", "container/heap",
    "crypto/pbkdf2", "database/sql", "debug/dwarf", "embed", "encoding/base32", "encoding/csv",
    "encoding/xml", "expvar", "go/doc", "go/parser", "hash/fnv", "hash/maphash", "html/template",
    "image/jpeg", "io/ioutil", "log/slog", "net/http/httputil", "net/http/pprof", "net/mail",
    "os/exec", "os/signal", "plugin", "runtime/metrics", "testing", "time/tzdata",
)  # fmt: skip
#: What a cold build of UP_PROGRAMS costs (bench/demo_cold.py measures it; docs/control-plane.md).
COLD_UP_BUILD = "about 13 CPU-minutes"

_VERSION_RE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


class BuildError(RuntimeError):
    """A binary could not be found or built."""


@dataclass(frozen=True)
class Binary:
    """One resolved program: where it is, what version it reports, and where it came from."""

    name: str
    path: Path
    version: tuple[int, int, int]
    source: str  # "KUBEBUILDER_ASSETS", "e2e/bin" or "PATH"


def parse_version(text: str) -> tuple[int, int, int] | None:
    """Return the first `X.Y.Z` in `text` (e.g. `Kubernetes v1.36.3`), or None."""
    match = _VERSION_RE.search(text)
    if match is None:
        return None
    return (int(match.group(1)), int(match.group(2)), int(match.group(3)))


def pinned(name: str) -> tuple[int, int, int]:
    """The version e2e/tools pins for program `name`."""
    versions = {"etcd": ETCD_VERSION, "helm": HELM_VERSION, "jaeger": JAEGER_VERSION}
    versions["kwok"] = KWOK_VERSION
    versions.update(dict.fromkeys(KREW_PROGRAMS, KREW_VERSION))
    text = versions.get(name, KUBE_VERSION)
    version = parse_version(text)
    assert version is not None
    return version


def minimum(name: str) -> tuple[int, int, int]:
    """The oldest version of program `name` accepted from outside e2e/bin."""
    oldest = {"etcd": MIN_ETCD, "helm": MIN_HELM, "jaeger": MIN_JAEGER, "kwok": MIN_KWOK}
    oldest.update(dict.fromkeys(KREW_PROGRAMS, MIN_KREW))
    return oldest.get(name, MIN_KUBE)


def binary_version(path: Path) -> tuple[int, int, int] | None:
    """Ask the program at `path` for its version (`--version`); None if it cannot say."""
    if path.name == "validate-krew-manifest":
        # It has no version to tell: its build records one beside it.
        stamp = path.with_name(f".{path.name}.version")
        return parse_version(stamp.read_text()) if stamp.is_file() else None
    # helm and jaeger say their versions through a subcommand; the others through a flag.
    ask = {"helm": ["version", "--short"], "jaeger": ["version"], "kubectl-krew": ["version"]}.get(
        path.name, ["--version"]
    )
    env = None
    if path.name == "kubectl-krew":
        # krew makes its folders under KREW_ROOT (default ~/.krew) on any command: not ours.
        env = {**os.environ, "KREW_ROOT": str(path.parent / ".krew-root")}
    try:
        out = subprocess.run(
            [str(path), *ask], capture_output=True, text=True, timeout=30, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    # etcd prints "etcd Version: 3.6.16", Kubernetes programs print "Kubernetes v1.36.3".
    return parse_version(out.stdout + out.stderr)


def _candidates(name: str, env: Mapping[str, str], bin_dir: Path) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    assets = env.get("KUBEBUILDER_ASSETS")
    if assets:
        found.append((Path(assets) / name, "KUBEBUILDER_ASSETS"))
    found.append((bin_dir / name, "e2e/bin"))
    on_path = shutil.which(name, path=env.get("PATH", os.defpath))
    if on_path:
        found.append((Path(on_path), "PATH"))
    return found


def find(name: str, env: Mapping[str, str] | None = None, bin_dir: Path = BIN_DIR) -> Binary | None:
    """Find a usable `name`: KUBEBUILDER_ASSETS or PATH when new enough, e2e/bin when pinned."""
    env = os.environ if env is None else env
    for path, source in _candidates(name, env, bin_dir):
        if not (path.is_file() and os.access(path, os.X_OK)):
            continue
        version = binary_version(path)
        if version is None:
            continue
        ok = version == pinned(name) if source == "e2e/bin" else version >= minimum(name)
        if ok:
            return Binary(name, path.resolve(), version, source)
    return None


def find_go(env: Mapping[str, str] | None = None) -> Path:
    """Locate the Go toolchain: $GO, then `go` on PATH, then /usr/local/go/bin/go."""
    env = os.environ if env is None else env
    choices = [env.get("GO", ""), shutil.which("go", path=env.get("PATH", os.defpath)) or ""]
    choices.append("/usr/local/go/bin/go")
    for choice in choices:
        if choice and Path(choice).is_file():
            out = subprocess.run(
                [choice, "env", "GOVERSION"], capture_output=True, text=True, check=False
            )
            version = parse_version(out.stdout)
            if version is not None and version >= MIN_GO:
                return Path(choice)
    wanted = ".".join(map(str, MIN_GO))
    raise BuildError(f"no Go >= {wanted} found (set GO=/path/to/go or put go on PATH)")


def kube_ldflags(version: str = KUBE_VERSION) -> str:
    """The -ldflags of an official build: stripped, with /version reporting `version`."""
    parsed = parse_version(version)
    assert parsed is not None
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={parsed[0]}",
            f"-X {pkg}.gitMinor={parsed[1]}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(flags)


def etcd_ldflags(version: str = ETCD_VERSION) -> str:
    """The -ldflags for etcd: stripped; etcd's version string is compiled in, only GitSHA is set."""
    return f"-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA={version}"


def helm_ldflags(version: str = HELM_VERSION) -> str:
    """The -ldflags for helm: stripped, with the version `helm version` reports."""
    return f"-s -w -X helm.sh/helm/v4/internal/version.version={version}"


def jaeger_ldflags(version: str = JAEGER_VERSION) -> str:
    """The -ldflags for jaeger: stripped, with the version `jaeger version` reports."""
    return f"-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion={version}"


def krew_ldflags(version: str = KREW_VERSION) -> str:
    """The -ldflags for krew: stripped, with the tag `kubectl krew version` reports."""
    return f"-s -w -X sigs.k8s.io/krew/internal/version.gitTag={version}"


def kwok_ldflags(version: str = KWOK_VERSION) -> str:
    """The -ldflags for kwok: stripped, with the version `kwok --version` reports (as its
    release script sets it)."""
    return f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={version}"


def _go_build(
    go: Path, module: Path, packages: Sequence[str], ldflags: Sequence[str], out_dir: Path
) -> None:
    """`go build` `packages` of tools module `module` into `out_dir`; `ldflags` are -ldflags
    values, each either plain or `package=flags` for one program of several."""
    env = dict(os.environ)
    # Never let go switch toolchains (that would download one); static binaries like upstream's.
    env.update({"CGO_ENABLED": "0", "GOTOOLCHAIN": "local"})
    env["GOFLAGS"] = " ".join(f for f in (env.get("GOFLAGS", ""), "-mod=readonly") if f)
    out_dir.mkdir(parents=True, exist_ok=True)
    nice = ["nice", "-n", "10"]
    # The packages to compile, counted first: the build's progress says how far it is. Listing
    # them also downloads the modules they come from, so that wait is shown on its own. The
    # network, not the CPU, sets its pace: the standard library compiles meanwhile, with the
    # build's own flags, so that the build below finds it in Go's cache.
    print(f"+ (cd {module} && go list -deps {' '.join(packages)})", flush=True)
    with _timed("modules ready and packages listed") as listed:
        started = time.monotonic()
        std = subprocess.Popen(
            [*nice, str(go), "build", *GO_FLAGS, *STD_ROOTS],
            cwd=module,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        out = subprocess.run(
            [*nice, str(go), "list", "-deps", "-f", "{{.Standard}}", *packages],
            cwd=module,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        listing = time.monotonic() - started
        # Never two compiles of one package at once: Go's cache does not share work in flight.
        # A failure here only leaves more for the build (a package a newer Go lacks, say).
        std_failed = std.wait() != 0
        if out.returncode != 0:
            print(out.stderr, flush=True)
            raise BuildError(f"go list failed in {module} (exit {out.returncode})")
        standard = out.stdout.split().count("true")
        # What the build has left to compile, cold: the packages beyond the standard library.
        total = len(out.stdout.split()) - (0 if std_failed else standard)
        listed.append(f"{total} packages to compile and {standard} of the standard library")
        listed.append(f"listing {listing:.0f}s, the standard library compiled beside it")
    cmd = [*nice, str(go), "build", "-v", *GO_FLAGS]
    for flags in ldflags:
        cmd += ["-ldflags", flags]
    cmd += ["-o", str(out_dir) + os.sep, *packages]
    print(f"+ (cd {module} && {shlex.join(cmd)})", flush=True)
    # `go build -v` names each package as it is compiled (a cached one is not named): count them
    # as progress, and keep the last lines for an error message.
    proc = subprocess.Popen(
        cmd, cwd=module, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    compiled = 0
    tail: list[str] = []
    with _timed("go build") as built:
        started = last = time.monotonic()
        for line in proc.stdout:
            compiled += 1
            tail = [*tail[-19:], line.rstrip()]
            now = time.monotonic()
            if now - last >= 15:
                last = now
                share = f" ({100 * compiled // total}%)" if total else ""
                print(
                    f"  ... {now - started:.0f}s, {compiled} of {total} packages compiled{share}",
                    flush=True,
                )
        returncode = proc.wait()
        built.append(f"{compiled} of {total} packages compiled")
    if returncode != 0:
        print("\n".join(tail), flush=True)
        raise BuildError(f"go build failed in {module} (exit {returncode})")


@contextmanager
def _timed(what: str) -> Iterator[list[str]]:
    """Print how long the block took, wall and CPU (of the processes it waited for); the block
    may append details to the list it is given."""
    details: list[str] = []
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    yield details
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    extra = "".join(f", {d}" for d in details)
    print(
        f"  {what} in {time.monotonic() - started:.0f}s "
        f"(CPU {user:.0f}s user, {system:.0f}s system{extra})",
        flush=True,
    )


def build(names: Sequence[str], go: Path | None = None) -> None:
    """Build `names` into e2e/bin at the pinned versions (one `go build` per tools module)."""
    go = find_go() if go is None else go
    print(
        f"building {', '.join(names)}: with Go's caches empty this takes minutes (what `make up` "
        f"runs: {COLD_UP_BUILD}, docs/control-plane.md), later seconds; progress every 15 s",
        flush=True,
    )
    staging = BIN_DIR / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    up = [n for n in UP_PROGRAMS if n in names]
    if up:
        # Each program's own version stamps, applied when its main package is linked.
        up_ldflags = {"etcd": etcd_ldflags(), "helm": helm_ldflags()}
        flags = [f"{UP_PACKAGES[n]}={up_ldflags.get(n) or kube_ldflags()}" for n in up]
        _go_build(go, UP_TOOLS, [UP_PACKAGES[n] for n in up], flags, staging)
        if "etcd" in up:
            # go names a binary after the path element before a major-version suffix: "server".
            (staging / "server").rename(staging / "etcd")
    if "jaeger" in names:
        _go_build(
            go,
            JAEGER_TOOLS,
            ["github.com/jaegertracing/jaeger/cmd/jaeger"],
            [jaeger_ldflags()],
            staging,
        )
    if set(KREW_PROGRAMS) & set(names):
        pkgs = ["sigs.k8s.io/krew/cmd/krew", "sigs.k8s.io/krew/cmd/validate-krew-manifest"]
        _go_build(go, KREW_TOOLS, pkgs, [krew_ldflags()], staging)
        (staging / "krew").rename(staging / "kubectl-krew")  # what kubectl finds as `kubectl krew`
        (staging / ".validate-krew-manifest.version").write_text(KREW_VERSION)
    if "kwok" in names:
        _go_build(go, KWOK_TOOLS, ["sigs.k8s.io/kwok/cmd/kwok"], [kwok_ldflags()], staging)
    for name in names:
        built = staging / name
        version = binary_version(built)
        if version != pinned(name):
            raise BuildError(f"built {name} reports version {version}, expected {pinned(name)}")
        if name == "validate-krew-manifest":
            os.replace(staging / f".{name}.version", BIN_DIR / f".{name}.version")
        os.replace(built, BIN_DIR / name)  # atomic: a half-written binary is never picked up
    shutil.rmtree(staging, ignore_errors=True)


def ensure(names: Sequence[str] = ALL_PROGRAMS, *, force: bool = False) -> dict[str, Binary]:
    """Return programs `names` (default: every one), building those missing (all when `force`).

    Callers ask for what they start, so a cluster's start never builds the tracing collector."""
    unknown = sorted(set(names) - set(ALL_PROGRAMS))
    if unknown:
        raise BuildError(
            f"unknown program(s) {', '.join(unknown)}: one of {', '.join(ALL_PROGRAMS)}"
        )
    wanted = [n for n in ALL_PROGRAMS if n in names]  # the build order, whatever the callers' order
    missing = list(wanted) if force else [n for n in wanted if find(n) is None]
    if missing:
        BIN_DIR.mkdir(parents=True, exist_ok=True)
        with (BIN_DIR / ".lock").open("w") as lock:
            # Concurrent runs (two test sessions) wait for one build instead of racing.
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not force:
                missing = [n for n in wanted if find(n) is None]
            if missing:
                started = time.monotonic()
                build(missing)
                took = time.monotonic() - started
                print(f"built {', '.join(missing)} in {took:.0f}s", flush=True)
    resolved: dict[str, Binary] = {}
    for name in wanted:
        found = find(name)
        if found is None:
            raise BuildError(f"{name} still not usable after building it")
        resolved[name] = found
    return resolved


def ensure_optional(name: str) -> Binary:
    """Return optional program ``name`` (one of OPTIONAL_PROGRAMS), building it when missing."""
    if name not in OPTIONAL_PROGRAMS:
        raise BuildError(f"{name} is not an optional program")
    found = find(name)
    if found is None:
        BIN_DIR.mkdir(parents=True, exist_ok=True)
        with (BIN_DIR / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if find(name) is None:
                started = time.monotonic()
                build([name])
                print(f"built {name} in {time.monotonic() - started:.0f}s", flush=True)
        found = find(name)
    if found is None:
        raise BuildError(f"{name} still not usable after building it")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build what is missing and print what will be used."""
    parser = argparse.ArgumentParser(prog="python -m keelgate_e2e.build", description=__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--print", action="store_true", help="only show what is found")
    parser.add_argument(
        "--for",
        dest="purpose",
        choices=sorted(PROGRAM_SETS),
        default="e2e",
        help="up: only what `make up` runs; e2e (default): every program the e2e suite uses",
    )
    args = parser.parse_args(argv)
    names = PROGRAM_SETS[args.purpose]
    try:
        if args.print:
            resolved = {n: b for n in names if (b := find(n)) is not None}
        else:
            resolved = ensure(names, force=args.force)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name in names:
        b = resolved.get(name)
        if b is None:
            print(f"{name:24} missing")
        else:
            print(f"{name:24} v{'.'.join(map(str, b.version)):10} {b.source:18} {b.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
