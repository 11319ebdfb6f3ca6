"""Unit tests of the e2e infrastructure's pure parts (no cluster): which binaries are used, the
kubelet's `$(VAR)` expansion and quantities, log rendering, and the node agent's volume files
(atomic writer, token refresh rule, subPath containment, masks).

They must never build or start anything: they run in a second.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keelgate_e2e import ETCD_VERSION, build
from keelgate_e2e.node.cpu import millicores, qos_class, requested_millicores, shares
from keelgate_e2e.node.env import ConfigError, command_line, expand, parse_quantity
from keelgate_e2e.node.logs import LogQuery, LogSource, stream_log
from keelgate_e2e.node.volumes import (
    FileProjection,
    Mount,
    VolumeError,
    format_map,
    masks,
    sub_path_source,
    token_needs_refresh,
    write_payload,
)

REPO = Path(__file__).resolve().parents[2]


def fake_binary(directory: Path, name: str, version_line: str) -> Path:
    """A script that answers `--version` like the real program."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    path.chmod(0o755)
    return path


def test_kubebuilder_assets_and_path_used_only_when_new_enough(tmp_path: Path) -> None:
    """KUBEBUILDER_ASSETS wins when its binary is >= 1.36; an older one there is passed over
    for one on PATH that is new enough; too old everywhere means none (so it gets built); and
    e2e/bin is used only at exactly the pinned version."""
    assets, on_path, bin_dir = tmp_path / "assets", tmp_path / "path", tmp_path / "bin"
    bin_dir.mkdir()
    fake_binary(assets, "kube-apiserver", "Kubernetes v1.37.2")
    fake_binary(on_path, "kube-apiserver", "Kubernetes v1.36.1")
    env = {"KUBEBUILDER_ASSETS": str(assets), "PATH": str(on_path)}
    found = build.find("kube-apiserver", env, bin_dir)
    assert found is not None and (found.source, found.version) == ("KUBEBUILDER_ASSETS", (1, 37, 2))

    fake_binary(assets, "kube-apiserver", "Kubernetes v1.31.0")
    found = build.find("kube-apiserver", env, bin_dir)
    assert found is not None and (found.source, found.version) == ("PATH", (1, 36, 1))

    fake_binary(on_path, "etcd", "etcd Version: 3.5.9")
    assert build.find("etcd", {"PATH": str(on_path)}, bin_dir) is None

    fake_binary(bin_dir, "etcd", "etcd Version: 3.6.15")  # not the pinned 3.6.16
    assert build.find("etcd", {"PATH": ""}, bin_dir) is None
    fake_binary(bin_dir, "etcd", f"etcd Version: {ETCD_VERSION.lstrip('v')}")
    pinned = build.find("etcd", {"PATH": ""}, bin_dir)
    assert pinned is not None and pinned.source == "e2e/bin"


def test_make_up_builds_only_what_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`make up` (its dry run) builds `--for up`, never the e2e suite's whole set, and that set is
    the cluster's four programs and helm: no jaeger, no krew, whose cold builds a first
    `make demo` would wait for without ever running them."""
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", "up", "DEV_DIR=/nonexistent"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "keelgate_e2e.build --for up" in dry and "--for e2e" not in dry, dry
    assert build.main(["--for", "up", "--print"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert listed == {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", "helm"}


def test_kube_ldflags_set_version_for_both_version_packages() -> None:
    """The build stamps gitVersion/major/minor into component-base and client-go, so /version
    reports the pinned release rather than v0.0.0."""
    flags = build.kube_ldflags("v1.36.3")
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {pkg}.gitVersion=v1.36.3" in flags
        assert f"-X {pkg}.gitMajor=1" in flags and f"-X {pkg}.gitMinor=36" in flags


#: A stand-in for `go` that records how it was called: `go list -deps -f {{.Standard}}` answers for
#: the packages it was given and two dependencies (one of the standard library); `go build -v -o`
#: names the programs, and writes each as a script reporting the version its own -ldflags stamped
#: (etcd's is in its source), as the real one does; `go build` of packages alone succeeds.
FAKE_GO = r"""#!PYTHON
import json, os, pathlib, re, sys
args = sys.argv[1:]
with open(os.environ["FAKE_GO_LOG"], "a") as log:
    log.write(json.dumps({"cwd": os.getcwd(), "args": args}) + "\n")
if args[0] == "list":
    print("\n".join(["true", "false", *["false" for _ in args[4:]]]))
elif args[0] == "build" and "-o" in args:
    out = pathlib.Path(args[args.index("-o") + 1])
    flags = dict(v.split("=", 1) for k, v in zip(args, args[1:]) if k == "-ldflags")
    for pkg in args[args.index("-o") + 2:]:
        print(pkg)
        # go names a binary after its path's last element, or the one before a /vN suffix.
        name = pkg.split("/")[-2] if pkg.endswith("/v3") else pkg.split("/")[-1]
        stamped = re.search(r"(?:gitVersion|version\.version)=(v[\d.]+)", flags.get(pkg, ""))
        version = "etcd Version: 3.6.16" if name == "server" else stamped.group(1)
        (out / name).write_text("#!/bin/sh\necho '" + version + "'\n")
        (out / name).chmod(0o755)
"""


def test_make_up_programs_come_from_one_go_build_with_their_own_version_stamps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `make up` runs (the three Kubernetes commands, etcd and helm) is built by one
    `go build` in one tools module, so the packages they share compile once; each program is
    linked with its own version stamps (helm's never land in kube-apiserver) and checked at the
    pinned version; the packages are counted first, so the progress says how far the build is,
    and the standard library compiles meanwhile with the same flags."""
    go = tmp_path / "go"
    go.write_text(FAKE_GO.replace("#!PYTHON", f"#!{sys.executable}", 1))
    go.chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_GO_LOG", str(calls))
    monkeypatch.setattr(build, "BIN_DIR", tmp_path / "bin")
    (tmp_path / "bin").mkdir()

    build.build(build.UP_PROGRAMS, go=go)

    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert {c["cwd"] for c in made} == {str(build.UP_TOOLS)}
    builds = [c["args"] for c in made if c["args"][0] == "build" and "-o" in c["args"]]
    assert len(builds) == 1 and sum(c["args"][0] == "list" for c in made) == 1
    argv = builds[0]
    # The standard library, compiled while the modules download, with the build's own flags
    # (any other flag and the build would find none of it in Go's cache).
    (std,) = [c["args"] for c in made if c["args"][0] == "build" and "-o" not in c["args"]]
    assert "runtime/metrics" in std and "net/http/pprof" in std
    assert [a for a in std if a.startswith("-")] == [a for a in argv if a in build.GO_FLAGS]
    packages = argv[argv.index("-o") + 2 :]
    assert packages == list(build.UP_PACKAGES.values())
    ldflags = [argv[i + 1] for i, a in enumerate(argv) if a == "-ldflags"]
    assert len(ldflags) == 5 and all(f.split("=", 1)[0] in packages for f in ldflags)
    helm = next(f for f in ldflags if f.startswith("helm.sh/"))
    assert "helm.sh/helm/v4/internal/version.version" in helm and "k8s.io/" not in helm
    for name in build.UP_PROGRAMS:
        found = build.find(name, {"PATH": ""}, tmp_path / "bin")
        assert found is not None and found.version == build.pinned(name), name
    out = capsys.readouterr().out
    total = len(packages) + 1  # the standard library's package is compiled beside the listing
    assert f"{total} packages to compile and 1 of the standard library" in out
    # How long the stand-in took is the machine's; how far the build got is the build's.
    timed = rf"go build in \d+s \(CPU \d+s user, \d+s system, {len(packages)} of {total} packages"
    assert re.search(timed, out), out


def test_cold_demo_bench_reads_the_build_s_timings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/demo_cold.py splits a `make demo` into phases from the lines keelgate_e2e.build
    prints (modules downloaded, each go build with its CPU and packages), make's echo of
    `make up` and the demo, and `make up`'s own summary: the report's breakdown comes from the
    same words the build writes."""
    spec = importlib.util.spec_from_file_location("demo_cold", REPO / "bench" / "demo_cold.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "demo_cold", bench)  # its dataclasses look themselves up
    spec.loader.exec_module(bench)
    print(f"+ (cd {build.UP_TOOLS} && go list -deps a b)")
    with build._timed("modules ready and packages listed") as listed:
        listed.append("2907 packages")
    with build._timed("go build") as built:
        built.append("2907 of 2907 packages compiled")
    printed = capsys.readouterr().out.splitlines()
    lines = [(10.0, printed[0]), (40.0, printed[1]), (400.0, printed[2])]
    lines += [
        (401.0, "PYTHONPATH=e2e .venv/bin/python -m keelgate_e2e --dir .dev up"),
        (430.0, 'cluster up in 28.5s (components: {"etcd": 0.3, "kube-apiserver": 3.1})'),
        (431.0, "PYTHONPATH=e2e .venv/bin/python examples/restock/cluster_demo.py --dir .dev"),
        (455.0, "the shop took 1 order(s)"),
    ]
    phases = {p.name: p for p in bench.phases(lines, venv_done=95.0)}
    assert set(phases) == {
        "Go modules downloaded, packages listed (e2e/tools/up)",
        "go build (e2e/tools/up)",
        "venv install (beside the Go build)",
        "cluster start and Keelgate's chart (make up)",
        "the demo",
    }
    built_phase = phases["go build (e2e/tools/up)"]
    assert (built_phase.end, built_phase.cpu_user, built_phase.cpu_system) == (400.0, 0.0, 0.0)
    assert built_phase.note == "2907 of 2907 packages compiled"
    cluster = phases["cluster start and Keelgate's chart (make up)"]
    assert (cluster.start, cluster.end) == (401.0, 430.0) and "etcd 0.3s" in cluster.note
    assert (phases["the demo"].start, phases["the demo"].end) == (431.0, 455.0)


def test_expand_like_the_kubelet() -> None:
    """`$(NAME)` expands from earlier variables, `$$` escapes, unknown names stay verbatim."""
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", env) == "1-two"
    assert expand("$$(A)", env) == "$(A)"
    assert expand("$(MISSING) $(A", env) == "$(MISSING) $(A"
    assert command_line({"command": ["echo"], "args": ["$(B)"]}, env) == ["echo", "two"]
    with pytest.raises(ConfigError):
        command_line({"name": "x"}, env)


@given(st.text(alphabet=st.characters(blacklist_characters="$")))
def test_expand_leaves_text_without_dollar_alone(text: str) -> None:
    """Text with no `$` is never changed by expansion."""
    assert expand(text, {"A": "1"}) == text


def test_parse_quantity() -> None:
    """Quantities with decimal and binary suffixes parse to their exact values."""
    assert parse_quantity("500m") * 1000 == 500
    assert parse_quantity("64Mi") == 64 * 2**20
    assert parse_quantity("2G") == 2 * 10**9
    assert parse_quantity("1e3") == 1000
    with pytest.raises(ConfigError):
        parse_quantity("12 bananas")


def test_stream_log_tail_limit_and_timestamps(tmp_path: Path) -> None:
    """Logs stored in CRI format come back as the kubelet serves them: --tail, --limit-bytes,
    --timestamps, and partial lines without an added newline."""
    log = tmp_path / "0.log"
    log.write_bytes(
        b"2026-01-01T00:00:00.000000001Z stdout F one\n"
        b"2026-01-01T00:00:01.000000001Z stdout F two\n"
        b"2026-01-01T00:00:02.000000001Z stdout P thr\n"
    )
    source = LogSource(log, lambda: False)

    def read(query: LogQuery) -> bytes:
        out: list[bytes] = []
        stream_log(source, query, out.append)
        return b"".join(out)

    assert read(LogQuery()) == b"one\ntwo\nthr"
    assert read(LogQuery(tail_lines=2)) == b"two\nthr"
    assert read(LogQuery(limit_bytes=5)) == b"one\nt"
    assert read(LogQuery(tail_lines=1, timestamps=True)) == b"2026-01-01T00:00:02.000000001Z thr"
    query = LogQuery.from_query("sinceTime=2026-01-01T00:00:01Z&follow=false")
    assert read(query) == b"two\nthr"


def test_atomic_writer_swaps_all_files_at_once(tmp_path: Path) -> None:
    """Volume files are written as the kubelet's atomic writer does: each top-level entry is a
    symlink through `..data` into one timestamped directory, with its mode; writing the same
    content again changes nothing; new content swaps `..data`, drops a vanished key's link and
    the old directory; a path leaving the volume is refused."""
    vol = tmp_path / "vol"
    first = {
        "user": FileProjection(b"ada", 0o400),
        "conf/app.conf": FileProjection(b"color=blue", 0o644),
    }
    assert write_payload(vol, first) is True
    data = vol / "..data"
    assert data.is_symlink() and os.readlink(vol / "user") == "..data/user"
    assert (vol / "conf" / "app.conf").read_bytes() == b"color=blue"
    assert (vol / "user").stat().st_mode & 0o777 == 0o400
    old = os.readlink(data)
    assert write_payload(vol, dict(first)) is False and os.readlink(data) == old

    assert write_payload(vol, {"conf/app.conf": FileProjection(b"color=red", 0o644)}) is True
    assert os.readlink(data) != old and not (vol / old).exists()
    assert not (vol / "user").is_symlink()
    assert (vol / "conf" / "app.conf").read_bytes() == b"color=red"
    assert sorted(p.name for p in vol.iterdir() if not p.name.startswith("..")) == ["conf"]
    with pytest.raises(VolumeError):
        write_payload(vol, {"../escape": FileProjection(b"x", 0o644)})


def test_token_refreshed_at_80_percent_or_after_a_day() -> None:
    """A token is refreshed once 80% of its lifetime has passed (the kubelet's rule), and a
    long-lived one after 24 hours."""
    issued = 1_000_000.0
    hour_token = issued + 3607
    assert not token_needs_refresh(issued + 2885, issued, hour_token)
    assert token_needs_refresh(issued + 2886, issued, hour_token)
    week_token = issued + 7 * 24 * 3600
    assert not token_needs_refresh(issued + 23 * 3600, issued, week_token)
    assert token_needs_refresh(issued + 24 * 3600, issued, week_token)


def test_sub_path_stays_inside_its_volume(tmp_path: Path) -> None:
    """A subPath resolves inside its volume (a missing one in a writable volume is created as a
    directory); `..`, an absolute path, a symlink out of the volume, or a missing subPath of a
    read-only volume are refused."""
    vol = tmp_path / "vol"
    vol.mkdir()
    assert sub_path_source(vol, "a/b", writable=True) == vol / "a" / "b"
    assert (vol / "a" / "b").is_dir()
    (vol / "out").symlink_to("/etc")
    for sub, writable in (("../x", True), ("/etc", True), ("out", True), ("nope", False)):
        with pytest.raises(VolumeError):
            sub_path_source(vol, sub, writable)


def test_host_service_account_directory_masked_unless_a_volume_covers_it() -> None:
    """The host's own service-account directory is hidden from a container, unless a mount sits
    at it, above it or inside it."""
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    present = lambda _path: True  # noqa: E731 (as if the host had the directory)
    assert masks([], present) == [token_dir]
    assert masks([Mount("/src", "/etc/config", False)], present) == [token_dir]
    for target in (token_dir, "/var/run/secrets", f"{token_dir}/token"):
        assert masks([Mount("/src", target, True)], present) == [], target
    assert masks([], lambda _path: False) == []


def test_downward_api_maps_formatted_like_go() -> None:
    """Labels and annotations in a downward-API file are sorted `key="value"` lines, quoted as
    Go's strconv.Quote does."""
    assert format_map({"tier": "e2e", "app": 'say "hi"\n'}) == 'app="say \\"hi\\"\\n"\ntier="e2e"'


def test_cpu_weights_follow_the_kubelets_rules() -> None:
    """A pod's CPU weight is its request in shares (1000m = 1024, at least 2), whatever the
    quantity's form; a pod without requests or limits is BestEffort, one with equal CPU and
    memory limits and requests Guaranteed; a quantity that is not one weighs nothing instead
    of stopping the node agent."""
    assert [millicores(q) for q in ("250m", "1", "0.5", "100u", "1k", "2e3m", "bad")] == [
        250,
        1000,
        500,
        0,
        1_000_000,
        2000,
        0,
    ]
    assert [shares(m) for m in (0, 1, 250, 1000)] == [2, 2, 256, 1024]

    def with_resources(resources: dict[str, dict[str, str]]) -> dict[str, object]:
        return {"metadata": {"uid": "u"}, "spec": {"containers": [{"resources": resources}]}}

    assert qos_class(with_resources({})) == "BestEffort"
    assert qos_class(with_resources({"requests": {"cpu": "250m"}})) == "Burstable"
    both = {"cpu": "500m", "memory": "64Mi"}
    assert qos_class(with_resources({"requests": both, "limits": both})) == "Guaranteed"
    assert qos_class(with_resources({"limits": both})) == "Guaranteed"  # requests default to limits
    assert requested_millicores(with_resources({"limits": {"cpu": "1"}})) == 1000
    assert qos_class({**with_resources({}), "status": {"qosClass": "Burstable"}}) == "Burstable"
