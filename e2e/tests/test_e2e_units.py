"""Unit tests of the e2e infrastructure's pure parts (no cluster): which binaries are used, the
kubelet's `$(VAR)` expansion and quantities, and log rendering.

They must never build or start anything: they run in a second.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keelgate_e2e import ETCD_VERSION, build
from keelgate_e2e.node.env import ConfigError, command_line, expand, parse_quantity
from keelgate_e2e.node.logs import LogQuery, LogSource, stream_log


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


def test_kube_ldflags_set_version_for_both_version_packages() -> None:
    """The build stamps gitVersion/major/minor into component-base and client-go, so /version
    reports the pinned release rather than v0.0.0."""
    flags = build.kube_ldflags("v1.36.3")
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {pkg}.gitVersion=v1.36.3" in flags
        assert f"-X {pkg}.gitMajor=1" in flags and f"-X {pkg}.gitMinor=36" in flags


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
