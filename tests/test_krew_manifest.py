"""The krew manifest template (.krew.yaml) and the archives deploy/krew/package.py builds agree.

What krew itself makes of them (validation, install on every platform, the installed plugin
against a cluster) is e2e/tests/test_e2e_krew.py; this checks, without building anything, that
a release's rendering of the template is a manifest krew reads and that it names exactly the
archives the packager builds.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


package = load_script("deploy/krew/package.py")


def _rendered(base_url: str = "") -> dict[str, object]:
    shas = {p.archive: f"{i:064x}" for i, p in enumerate(package.PLATFORMS)}
    text = package.render(package.TEMPLATE.read_text(), tag="v9.8.7", shas=shas, base_url=base_url)
    loaded: dict[str, object] = yaml.safe_load(text)
    return loaded


def test_a_release_renders_a_manifest_naming_each_archive_with_its_checksum() -> None:
    """Rendered for tag v9.8.7, the manifest is a krew Plugin named keelgate at that version,
    one platform per archive the packager builds, each with its release URL, its sha256, and
    the launcher as bin."""
    plugin = _rendered()
    assert plugin["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert plugin["kind"] == "Plugin" and plugin["metadata"] == {"name": "keelgate"}
    spec = plugin["spec"]
    assert isinstance(spec, dict) and spec["version"] == "v9.8.7"
    platforms = spec["platforms"]
    assert [
        (p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"])
        for p in platforms
    ] == [(p.os, p.arch) for p in package.PLATFORMS]
    for index, (entry, platform) in enumerate(zip(platforms, package.PLATFORMS, strict=True)):
        assert entry["uri"] == f"{package.RELEASES}v9.8.7/{platform.archive}"
        assert entry["sha256"] == f"{index:064x}"
        assert entry["bin"] == package.LAUNCHER.name == "kubectl-keelgate"
    assert spec["shortDescription"] and len(spec["shortDescription"]) <= 50


def test_a_base_url_points_every_archive_elsewhere() -> None:
    """--base-url (the tests' loopback server, a mirror) replaces the release address and keeps
    each archive's name."""
    spec = _rendered("http://127.0.0.1:1234/")["spec"]
    assert isinstance(spec, dict)
    uris = [p["uri"] for p in spec["platforms"]]
    assert uris == [f"http://127.0.0.1:1234/{p.archive}" for p in package.PLATFORMS]


def test_a_template_naming_an_archive_that_is_not_built_is_refused() -> None:
    """A platform added to .krew.yaml but not to the packager stops the release in one line."""
    with pytest.raises(SystemExit, match=r"kubectl-keelgate_windows_amd64\.tar\.gz"):
        package.render(
            '{{addURIAndSha "https://x/{{ .TagName }}/kubectl-keelgate_windows_amd64.tar.gz" '
            ".TagName }}",
            tag="v1.0.0",
            shas={},
        )


def test_the_version_is_the_packages_and_the_launcher_is_posix_sh() -> None:
    """The tag a release renders is pyproject's version, and a version krew accepts (krew
    refuses a manifest whose version is not semantic, vMAJOR.MINOR.PATCH); the launcher parses
    under `sh -n`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert package.version() == project["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", package.version()), "krew wants vX.Y.Z tags"
    checked = subprocess.run(["sh", "-n", str(package.LAUNCHER)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert package.LAUNCHER.stat().st_mode & 0o111
