"""Build the krew archives of ``kubectl keelgate`` and render its krew manifest beside them.

Why it exists: krew installs a plugin from an archive per platform that its manifest names with
a sha256. The plugin is Python, so each archive holds a small launcher (deploy/krew/
kubectl-keelgate), the LICENSE, and every wheel the plugin needs for that platform and each
supported CPython: keelgate's own wheel and its base dependencies only (no operator, no model
SDK). The launcher makes a virtual environment from them on its first run, without a download.

``.krew.yaml`` (krew-release-bot's template) is rendered with the archives' sha256; ``--base-url``
points the uris somewhere else than the release (the tests serve the archives on loopback).
Archives are reproducible from the same wheels: sorted members, no owners, fixed times.

It must never install anything (pip only downloads wheels) nor write outside ``--out``.

Run as ``python deploy/krew/package.py --out dist/krew`` (``make krew``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import hashlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / ".krew.yaml"
LAUNCHER = Path(__file__).resolve().parent / "kubectl-keelgate"
RELEASES = "https://github.com/keelgate/keelgate/releases/download/"
PYTHONS = ("3.11", "3.12", "3.13", "3.14")


@dataclass(frozen=True)
class Platform:
    """One krew platform and the wheel platform tags pip may pick for it."""

    os: str
    arch: str
    tags: tuple[str, ...]

    @property
    def archive(self) -> str:
        return f"kubectl-keelgate_{self.os}_{self.arch}.tar.gz"


# pip prefers the tags given first: the oldest systems first, so each dependency comes as the
# wheel that runs on the most machines.
def _manylinux(arch: str) -> tuple[str, ...]:
    return (f"manylinux2014_{arch}", *(f"manylinux_2_{m}_{arch}" for m in (17, 28, 34)))


def _macos(arch: str, oldest: int) -> tuple[str, ...]:
    versions = ["10_9", "10_12", "10_13", "10_15"] + [f"{major}_0" for major in range(11, 16)]
    tags = [f"macosx_{v}_{a}" for v in versions for a in (arch, "universal2")]
    return tuple(t for t in tags if int(t.split("_")[1]) >= oldest)


PLATFORMS = (
    Platform("linux", "amd64", _manylinux("x86_64")),
    Platform("linux", "arm64", _manylinux("aarch64")),
    Platform("darwin", "amd64", _macos("x86_64", 10)),
    Platform("darwin", "arm64", _macos("arm64", 11)),
)


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def build_wheel(out: Path) -> Path:
    """keelgate's wheel from this checkout (``pip wheel --no-deps``)."""
    _pip("wheel", "--no-deps", "--wheel-dir", str(out), str(ROOT))
    (wheel,) = out.glob("keelgate-*.whl")
    return wheel


def download(wheel: Path, platform: Platform, python: str, dest: Path) -> None:
    """Every wheel ``wheel`` needs on ``platform`` under CPython ``python`` (wheels only)."""
    tags = [arg for tag in platform.tags for arg in ("--platform", tag)]
    _pip(
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python,
        *tags,
        "--dest",
        str(dest),
        str(wheel),
    )


def archive(platform: Platform, wheels: list[Path], out: Path) -> Path:
    """The platform's archive: launcher, LICENSE, wheels; same inputs, same bytes."""
    members = [("kubectl-keelgate", LAUNCHER, 0o755), ("LICENSE", ROOT / "LICENSE", 0o644)]
    members += [(f"wheels/{w.name}", w, 0o644) for w in sorted(wheels, key=lambda w: w.name)]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path, mode in members:
            info = tarfile.TarInfo(name)
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    target = out / platform.archive
    with target.open("wb") as file, gzip.GzipFile(fileobj=file, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return target


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_ADD = re.compile(r'\{\{\s*addURIAndSha\s+"([^"]+)"\s+\.TagName\s*\}\}')
_TAG = re.compile(r"\{\{\s*\.TagName\s*\}\}")


def render(template: str, *, tag: str, shas: dict[str, str], base_url: str = "") -> str:
    """krew-release-bot's rendering of ``template``: ``{{ .TagName }}`` is the tag and each
    ``{{addURIAndSha "URL" .TagName }}`` becomes ``uri: URL`` and ``sha256: ...`` of the archive
    the URL names (``base_url`` replaces everything before the archive's file name)."""

    def add(match: re.Match[str]) -> str:
        url = _TAG.sub(tag, match.group(1))
        name = url.rsplit("/", 1)[1]
        if name not in shas:
            raise SystemExit(f"package.py: error: .krew.yaml names {name}, which was not built")
        uri = f"{base_url.rstrip('/')}/{name}" if base_url else url
        indent = " " * (match.start() - template.rfind("\n", 0, match.start()) - 1)
        # Quoted: a hex digest of digits only, or digits around one "e", would read as a number.
        return f'uri: {uri}\n{indent}sha256: "{shas[name]}"'

    return _TAG.sub(tag, _ADD.sub(add, template))


def package(
    out: Path,
    *,
    base_url: str = "",
    platforms: tuple[Platform, ...] = PLATFORMS,
    pythons: tuple[str, ...] = PYTHONS,
) -> Path:
    """Build every archive into ``out`` and write ``out/keelgate.yaml``; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="krew-") as scratch:
        work = Path(scratch)
        wheel = build_wheel(work / "dist")
        jobs = {(p, py): work / f"{p.os}-{p.arch}-{py}" for p in platforms for py in pythons}
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            for done in [pool.submit(download, wheel, p, py, d) for (p, py), d in jobs.items()]:
                done.result()
        shas = {}
        for platform in platforms:
            found = {w.name: w for (p, _), d in jobs.items() if p == platform for w in d.iterdir()}
            built = archive(platform, list(found.values()), out)
            shas[built.name] = sha256(built)
    manifest = out / "keelgate.yaml"
    tag = f"v{version()}"
    manifest.write_text(render(TEMPLATE.read_text(), tag=tag, shas=shas, base_url=base_url))
    return manifest


def _pip(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"package.py: error: pip {args[0]} failed: {tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "krew")
    parser.add_argument("--base-url", default="", help="where the archives will be served")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out: {args.out} is not a folder")
    manifest = package(args.out, base_url=args.base_url)
    print(manifest)
    for built in sorted(args.out.glob("*.tar.gz")):
        print(f"{sha256(built)}  {built.name}  {built.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
