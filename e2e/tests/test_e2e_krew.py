"""`kubectl keelgate` installed the way kubectl plugins usually are: with krew.

The repository's krew manifest (.krew.yaml, krew-release-bot's template) is rendered over
archives built from this checkout (deploy/krew/package.py), served on loopback as a release
would serve them. krew's own validator (validate-krew-manifest, built from krew's Go module at
the pinned release) checks it and installs every platform; `kubectl krew install` then installs
it for this machine, and the plugin it installed talks to the test cluster. The tests must never
touch ~/.krew: every krew command gets its own KREW_ROOT.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from keelgate_e2e import build
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.kube import Kube
from keelgate_e2e.plugin import kubeconfig_for
from keelgate_e2e.runs import agentrun, apply, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl

# The first test's setup renders the release: pip fetches every platform's wheels (about 100 s
# on an idle machine, past the suite's 300 s on a loaded one, where `.ci/run` once timed out).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def _load_packager() -> ModuleType:
    # deploy/krew/package.py is a release script, not part of a package: load it by its path.
    spec = importlib.util.spec_from_file_location("krew_package", ROOT / "deploy/krew/package.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


package = _load_packager()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # krew's downloads are not the test's output


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The archives and the rendered manifest, served over HTTP on 127.0.0.1 like a release."""
    out = tmp_path_factory.mktemp("krew-release")
    handler = functools.partial(_Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        package.package(out, base_url=f"http://127.0.0.1:{server.server_address[1]}/")
        yield out
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def krew_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding `kubectl-krew` (so `kubectl krew` works) and the validator."""
    programs = build.ensure(build.KREW_PROGRAMS)
    folder = tmp_path_factory.mktemp("krew-bin")
    for name in build.KREW_PROGRAMS:
        (folder / name).symlink_to(programs[name].path)
    return folder


def _path(*first: Path) -> str:
    # This venv's bin holds a kubectl-keelgate too: leave it out, so kubectl finds krew's.
    ours = str(Path(sys.executable).parent)
    rest = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p != ours]
    return os.pathsep.join([*map(str, first), *rest])


def _run(
    argv: list[str], env: Mapping[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env={"HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8", **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_manifest_passes_krews_validator_on_every_platform(
    release: Path, krew_bin: Path, kubectl_bin: Path, tmp_path: Path
) -> None:
    """krew's validate-krew-manifest accepts the rendered .krew.yaml: the name matches the
    file, the version is the package's, no platform selector overlaps another, and each of the
    four platforms installs from its archive (sha256 checked, LICENSE and bin present)."""
    manifest = release / "keelgate.yaml"
    plugin = yaml.safe_load(manifest.read_text())
    assert plugin["spec"]["version"] == f"v{package.version()}"
    assert len(plugin["spec"]["platforms"]) == len(package.PLATFORMS) == 4
    checked = _run(
        [str(krew_bin / "validate-krew-manifest"), "-manifest", str(manifest)],
        {"PATH": _path(krew_bin, kubectl_bin.parent), "TMPDIR": str(tmp_path)},
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert "all 4 spec.platforms installed fine" in checked.stderr


def test_krew_refuses_an_archive_that_is_not_the_one_the_manifest_names(
    release: Path, krew_bin: Path, kubectl_bin: Path, tmp_path: Path
) -> None:
    """One byte added to the served archive: `kubectl krew install` stops on the sha256 and
    installs nothing, so the manifest's checksums are what protects users."""
    host = next(p for p in package.PLATFORMS if (p.os, p.arch) == ("linux", "amd64"))
    archive = release / host.archive
    original = archive.read_bytes()
    try:
        archive.write_bytes(original + b"\0")
        root = tmp_path / "krew"
        done = _run(
            ["kubectl", "krew", "install", f"--manifest={release / 'keelgate.yaml'}"],
            {"PATH": _path(krew_bin, kubectl_bin.parent), "KREW_ROOT": str(root)},
        )
    finally:
        archive.write_bytes(original)
    assert done.returncode != 0
    assert "checksum does not match" in done.stderr, done.stderr[-2000:]
    assert not (root / "bin" / "kubectl-keelgate").exists()


def test_krew_installs_a_plugin_that_lists_runs_and_carries_no_operator(
    release: Path,
    krew_bin: Path,
    kubectl_bin: Path,
    cluster: Cluster,
    admin: Kube,
    kubectl: Kubectl,
    tenant: str,
    shop: ShopServer,
    tmp_path: Path,
) -> None:
    """`kubectl krew install` puts `kubectl keelgate` on PATH; its first run makes its own
    environment from the archive's wheels (no kopf, no model SDK in it), and as alice it lists
    the run in her namespace; `kubectl krew uninstall` takes the plugin and its environment
    away."""
    root = tmp_path / "krew"
    env = {"PATH": _path(krew_bin, kubectl_bin.parent), "KREW_ROOT": str(root)}
    installed = _run(["kubectl", "krew", "install", f"--manifest={release / 'keelgate.yaml'}"], env)
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert (root / "bin" / "kubectl-keelgate").is_symlink()

    apply(kubectl, agentrun("krewed", shop, []))
    wait_phase(admin, tenant, "krewed", "Succeeded", timeout=90)
    config = kubeconfig_for(cluster.kubeconfig, tmp_path / "alice.yaml", "alice", tenant)
    user = {"PATH": _path(root / "bin", kubectl_bin.parent), "KUBECONFIG": str(config)}
    listed = _run(["kubectl", "keelgate", "list", "-o", "name"], user)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "agentrun.keelgate.dev/krewed" in listed.stdout.split()
    assert "first run" in listed.stderr  # said once, on stderr, while it set itself up
    again = _run(["kubectl", "keelgate", "list", "-o", "name"], user)
    assert again.returncode == 0 and again.stderr == "", again.stderr

    store = root / "store" / "keelgate" / f"v{package.version()}"
    (environment,) = store.glob(".venv-py3*")
    site = next(environment.glob("lib/python3.*/site-packages"))
    dists = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert "keelgate" in dists
    assert not dists & {
        "kopf",
        "openai",
        "anthropic",
        "mcp",
        "prometheus_client",
        "cloudevents",
        "psycopg",
    }

    # `list` and `uninstall` want a local index (what `kubectl krew update` clones from
    # krew-index): an empty git repository stands for it, as krew cannot reach GitHub here.
    subprocess.run(["git", "init", "-q", str(root / "index" / "default")], check=True)
    shown = _run(["kubectl", "krew", "list"], env)
    # installed from a manifest, not from an index: krew calls it detached
    assert shown.returncode == 0 and "detached/keelgate" in shown.stdout.split(), shown.stderr
    removed = _run(["kubectl", "krew", "uninstall", "keelgate"], env)
    assert removed.returncode == 0, removed.stderr[-2000:]
    assert not store.exists() and not (root / "bin" / "kubectl-keelgate").exists()
    shutil.rmtree(root, ignore_errors=True)
