"""Where the cookiecutter templates live, and the runtime wheel a generated project carries.

A generated project is self-contained: `vendor/` holds the wheel of the Enhydra that made it,
and its pyproject.toml points at that file, so a clone installs on a machine where no package
index has Enhydra. The wheel is made from what is running: built from the source tree when
Enhydra runs from a checkout (an editable install), or put back together from the installed
files (listed, with their hashes, in the distribution's RECORD) when it was installed from a
wheel, as it is inside such a project.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
DISTRIBUTION = "enhydra"
VENDOR = "vendor"
# The requirement a vendoring project's pyproject.toml holds; hatchling expands {root:uri} to
# the project folder, wherever the clone is (needs tool.hatch.metadata.allow-direct-references).
VENDORED_REQUIREMENT = re.compile(r"""(["'])enhydra\s*@\s*\{root:uri\}/vendor/[^"']*\1""")
INDEX_REQUIREMENT = re.compile(r"""["'](enhydra(?![\w.-]*\s*@)[^"']*)["']""")
# Wheels are built reproducibly: every entry gets this timestamp (the one hatchling uses).
_ZIP_TIME = (2020, 2, 2, 0, 0, 0)
# Files pip writes next to an installed distribution that were not in its wheel.
_INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


class ScaffoldError(RuntimeError):
    """The templates or the runtime wheel cannot be had; the message says why and what to do."""


def scaffold_root() -> Path:
    """The folder holding cookiecutter.json, template/ and generators/."""
    bundled = _PACKAGE / "_scaffold"
    if (bundled / "template").is_dir():
        return bundled
    checkout = source_checkout()
    if checkout is not None and (checkout / "template" / "cookiecutter.json").is_file():
        return checkout
    raise FileNotFoundError("enhydra's templates are missing from this installation")


def service_template() -> Path:
    return scaffold_root() / "template"


def source_checkout() -> Path | None:
    """The Enhydra source tree this package runs from (an editable install), if any."""
    root = _PACKAGE.parents[1]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(r'^name = "enhydra"$', pyproject.read_text(), re.M):
        return root
    return None


# --------------------------------------------------------------------------- the runtime wheel


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def wheel_digest(wheel: Path) -> str:
    """A digest of a wheel's contents (names and bytes), blind to zip timestamps and order."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            if name.endswith(".dist-info/RECORD"):
                continue
            digest.update(name.encode() + b"\0" + archive.read(name) + b"\0")
    return "sha256:" + digest.hexdigest()


def wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name (name-version-tags.whl)."""
    return wheel.name.split("-")[1]


def _wheel_from_source(source: Path, dest: Path) -> Path:
    """`pip wheel` of the source tree: the same wheel a release build makes."""
    with tempfile.TemporaryDirectory(prefix="enhydra-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", tmp, str(source)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        built = sorted(Path(tmp).glob("enhydra-*.whl"))
        if result.returncode != 0 or not built:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise ScaffoldError(
                f"could not build Enhydra's wheel from {source}: {tail[0]} "
                "(it needs pip and the build backend hatchling from the package index)"
            )
        target = dest / built[0].name
        shutil.move(built[0], target)
        return target


def _wheel_from_installation(dist: importlib.metadata.Distribution, dest: Path) -> Path:
    """Put the installed wheel back together from the files its RECORD lists, hashes checked."""
    files = dist.files or []
    info = next((f.parts[0] for f in files if f.parts[0].endswith(".dist-info")), None)
    if info is None:
        raise ScaffoldError(f"the installed {DISTRIBUTION} has no RECORD: reinstall it with pip")
    tags = [
        line.partition(":")[2].strip()
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]
    if len(tags) != 1:
        raise ScaffoldError(f"{info}/WHEEL names {len(tags)} tags, expected one: reinstall it")
    entries: list[tuple[str, bytes]] = []
    for path in files:
        name = path.as_posix()
        if path.parts[0] == ".." or "__pycache__" in path.parts or name.endswith(".pyc"):
            continue  # console scripts (rewritten per machine) and bytecode pip compiled
        if path.parts[0] == info and path.name in _INSTALLER_FILES:
            continue
        data = Path(str(dist.locate_file(path))).read_bytes()
        if path.hash is not None and _record_hash(data) != f"{path.hash.mode}={path.hash.value}":
            raise ScaffoldError(
                f"{dist.locate_file(path)} was changed after {DISTRIBUTION} was installed: "
                f"reinstall {DISTRIBUTION} (pip install --force-reinstall) before vendoring it"
            )
        entries.append((name, data))
    normalized = re.sub(r"[-_.]+", "_", dist.metadata["Name"]).lower()
    target = dest / f"{normalized}-{dist.version}-{tags[0]}.whl"
    # dist-info last, RECORD last of all, as the wheel format recommends.
    entries.sort(key=lambda entry: (entry[0].startswith(info + "/"), entry[0]))
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{info}/RECORD", f"{record}{info}/RECORD,,\n".encode()))
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            item = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(item, data)
    partial.replace(target)
    return target


def runtime_wheel(dest: Path) -> Path:
    """Write the wheel of the running Enhydra into `dest` and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    source = source_checkout()
    if source is not None:
        return _wheel_from_source(source, dest)
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ScaffoldError(
            f"{DISTRIBUTION} runs from {_PACKAGE} but is not installed: install it with pip"
        ) from None
    return _wheel_from_installation(dist, dest)


# --------------------------------------------------------------------------- vendoring


@dataclass(frozen=True)
class Vendored:
    """What `vendor_runtime` did: the wheel now in vendor/, and the one it replaced."""

    wheel: Path
    previous: Path | None
    changed: bool

    def describe(self, root: Path) -> str:
        where = self.wheel.relative_to(root)
        if not self.changed:
            return f"{where} is already this Enhydra ({wheel_version(self.wheel)}): nothing to do"
        if self.previous is None:
            return f"{where}: Enhydra {wheel_version(self.wheel)} vendored"
        old, new = wheel_version(self.previous), wheel_version(self.wheel)
        what = f"{old} -> {new}" if old != new else f"{new}, rebuilt with other contents"
        return f"{where}: Enhydra {what}"


def vendored_wheel(project: Path) -> Path | None:
    """The runtime wheel a project vendors (vendor/enhydra-*.whl), if it vendors one."""
    wheels = sorted((project / VENDOR).glob("enhydra-*.whl"))
    return wheels[-1] if wheels else None


def point_pyproject_at(pyproject: Path, wheel_name: str) -> bool:
    """Make pyproject.toml's Enhydra requirement name `vendor/<wheel_name>`; True if it changed."""
    text = pyproject.read_text()
    if not VENDORED_REQUIREMENT.search(text):
        found = INDEX_REQUIREMENT.search(text)
        how = f"{found.group(1)!r} from a package index" if found else "no Enhydra requirement"
        raise ScaffoldError(
            f"{pyproject} has {how}, not a vendored wheel: upgrade it with pip "
            "(pip install -U enhydra), or generate the project with enhydra_source=vendor"
        )
    new = VENDORED_REQUIREMENT.sub(f'"enhydra @ {{root:uri}}/{VENDOR}/{wheel_name}"', text)
    if new == text:
        return False
    pyproject.write_text(new)
    return True


def vendor_runtime(project: Path) -> Vendored:
    """Put the running Enhydra's wheel into PROJECT/vendor/ and point pyproject.toml at it.

    A wheel with the same contents is left as it is (no change for git to show); any other
    Enhydra wheel in vendor/ is removed, so there is only ever one.
    """
    pyproject = project / "pyproject.toml"
    if not pyproject.is_file():
        raise ScaffoldError(
            f"{project} has no pyproject.toml: is it a project made by enhydra new?"
        )
    if not VENDORED_REQUIREMENT.search(pyproject.read_text()):
        point_pyproject_at(pyproject, "")  # raises, saying where the project takes Enhydra from
    vendor = project / VENDOR
    vendor.mkdir(exist_ok=True)
    previous = vendored_wheel(project)
    with tempfile.TemporaryDirectory(prefix=".enhydra-", dir=vendor) as tmp:
        built = runtime_wheel(Path(tmp))
        target = vendor / built.name
        unchanged = previous == target and wheel_digest(previous) == wheel_digest(built)
        if not unchanged:
            built.replace(target)
    for stale in vendor.glob("enhydra-*.whl"):
        if stale != target:
            stale.unlink()
    repointed = point_pyproject_at(pyproject, target.name)
    return Vendored(target, previous, changed=not unchanged or repointed)
