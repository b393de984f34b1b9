"""Build a service's container image and run a few of it, with podman (`enhydra image`).

Made for machines with no Docker engine and no registry but Debian's packages and PyPI:

- `prepare` installs podman + runc from Debian (once), writes a containers.conf that works on
  hosts without systemd or with hybrid cgroups (runc, cgroupfs, lower ulimits), and makes a
  Debian base image with debootstrap (cached as a tarball, so the next machine state is seconds).
- `build` makes a wheelhouse on the host (the project, Enhydra from this checkout when it is
  installed from one, every dependency, the build backend) and builds the project's own
  Dockerfile with `--network none`: nothing inside the build reaches the network.
- `run` starts N containers on the host network against a Kafka broker, each with its own
  ENHYDRA_INSTANCE_ID, zone tag, web port and named state volume; `stop` stops them gracefully
  and reports how long each took and its exit code; `logs` prints a container's log.

The functions are the API (tests/containers uses them); `enhydra image` (cli/image.py) is a
thin shell over them. Long steps pass their output to an `output` callback line by line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from enhydra.devtools.process import run_streaming
from enhydra.scaffold import source_checkout, vendored_wheel
from enhydra.toolcache import cache_root, file_lock

BASE_IMAGE = "localhost/enhydra-base:bookworm"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# No python3-pip: the image's Dockerfile makes a venv (python3-venv brings pip's wheel). tini is
# here so the Dockerfile's "install tini if missing" step needs no apt and no network.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "tini")
STATE_DIR = "/var/lib/enhydra"
GROUP_LABEL = "io.enhydra.group"
STOP_GRACE_S = 30

# crun fails on hybrid cgroup hosts and systemd may not be PID 1: runc + cgroupfs always work.
# The default ulimits (1M open files) are above what such hosts let a container have.
# k8s-file logs and file events need no journald.
CONTAINERS_CONF = """\
# Written by `enhydra image prepare`; use it with: export CONTAINERS_CONF={path}
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


# Receives progress lines: the commands run and their output, as they come.
Output = Callable[[str], None]


class ImageError(RuntimeError):
    """A step of prepare/build/run failed; the message says which and what to do."""


# --------------------------------------------------------------------------- podman plumbing


def conf_path() -> Path:
    return cache_root() / "podman" / "containers.conf"


def write_conf() -> Path:
    """Write the containers.conf (only when its content changed) and return its path."""
    path = conf_path()
    text = CONTAINERS_CONF.format(path=path)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(write_conf())}


def podman(
    *args: str, check: bool = True, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run `podman ARGS` with our containers.conf; a failure raises with podman's own words."""
    if shutil.which("podman") is None:
        raise ImageError("podman is not installed: run `enhydra image prepare` (as root)")
    cmd = ["podman", *args]
    try:
        result = subprocess.run(
            cmd, env=podman_env(), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"`{shlex.join(cmd)}` did not finish in {timeout:.0f}s") from exc
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()[-2000:]
        raise ImageError(f"`{shlex.join(cmd)}` failed (exit {result.returncode}): {detail}")
    return result


def image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


def _image_id(ref: str) -> str | None:
    result = podman("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def image_size(ref: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One prepare/build at a time per cache (parallel test workers share the base image)."""
    with file_lock(cache_root() / "locks" / name):
        yield


def _run(
    cmd: Sequence[str],
    *,
    what: str,
    timeout: float,
    log: Path | None = None,
    output: Output | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run a host command, its lines to `output` as they come; raise with its tail on failure."""
    if output is not None:
        output(f"enhydra: {what}: {shlex.join(cmd)}")
    done = run_streaming(
        cmd, timeout=timeout, on_line=output, log=log, env=env if env is not None else podman_env()
    )
    if done.timed_out:
        raise ImageError(f"{what}: `{shlex.join(cmd)}` took longer than {timeout:.0f}s")
    if not done.ok:
        where = f" (full output: {log})" if log else ""
        raise ImageError(f"{what} failed (exit {done.returncode}){where}:\n{done.last_lines(30)}")


# --------------------------------------------------------------------------- prepare


@dataclass
class Prepared:
    installed: list[str]
    base: str
    base_from: str  # "existing", "cache" or "debootstrap"
    seconds: float


def _apt_install(packages: list[str], output: Output | None) -> None:
    if not packages:
        return
    if shutil.which("apt-get") is None:
        raise ImageError(
            f"{', '.join(packages)} missing and this is not a Debian/Ubuntu machine: "
            "install podman and runc with your package manager"
        )
    if os.geteuid() != 0:
        raise ImageError(
            f"{', '.join(packages)} missing: run `enhydra image prepare` as root, or "
            f"`sudo apt-get install {' '.join(packages)}`"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for what, cmd in (
        ("updating the package lists", ["apt-get", "update", "-qq"]),
        (
            f"installing {' '.join(packages)}",
            ["apt-get", "install", "-y", "--no-install-recommends", *packages],
        ),
    ):
        _run(cmd, what=what, timeout=900, output=output, env=env)


def base_tarball(suite: str = SUITE) -> Path:
    return cache_root() / "images" / f"enhydra-base-{suite}.tar"


def _debootstrap(suite: str, mirror: str, tarball: Path, output: Output | None) -> None:
    """Make a minimal Debian root filesystem and keep it as a tarball in the cache."""
    work = tarball.parent / f".rootfs-{suite}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                suite,
                str(work),
                mirror,
            ],
            what=f"debootstrap of Debian {suite}",
            timeout=900,
            log=tarball.parent / f"debootstrap-{suite}.log",
            output=output,
        )
        # Package caches are dead weight in every image built on top.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (work / junk).glob("*"):
                if entry.is_file():
                    entry.unlink()
        partial = tarball.with_suffix(".tar.partial")
        _run(
            ["tar", "--numeric-owner", "-C", str(work), "-cf", str(partial), "."],
            what="archiving the base root filesystem",
            timeout=300,
            output=output,
        )
        partial.rename(tarball)  # atomic: an interrupted run never leaves a half tarball
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prepare(
    base: str = BASE_IMAGE,
    *,
    suite: str = SUITE,
    mirror: str = MIRROR,
    output: Output | None = None,
) -> Prepared:
    """Install what is missing, write containers.conf, make or reuse the base image. Idempotent.

    `output` receives each step's command and output lines as they come.
    """
    started = time.monotonic()
    with _locked("prepare"):
        missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
        if "podman" in missing:
            missing.append("netavark")  # podman's network stack; a virtual dependency in Debian
        write_conf()
        tarball = base_tarball(suite)
        need_base = shutil.which("podman") is None or not image_exists(base)
        if need_base and not tarball.exists() and shutil.which("debootstrap") is None:
            missing.append("debootstrap")
        _apt_install(missing, output)

        if not need_base:
            base_from = "existing"
        else:
            base_from = "cache" if tarball.exists() else "debootstrap"
            if not tarball.exists():
                tarball.parent.mkdir(parents=True, exist_ok=True)
                _debootstrap(suite, mirror, tarball, output)
            if output is not None:
                output(f"enhydra: importing the base image {base} from {tarball}")
            podman(
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                "ENV LANG=C.UTF-8",
                "--change",
                'CMD ["/bin/bash"]',
                str(tarball),
                base,
                timeout=600,
            )
    return Prepared(missing, base, base_from, time.monotonic() - started)


# --------------------------------------------------------------------------- build


@dataclass
class Built:
    tag: str
    size_bytes: int
    seconds: float  # wheelhouse + image build
    wheelhouse_seconds: float
    image_seconds: float
    log: Path

    @property
    def size_mb(self) -> float:
        return self.size_bytes / 1e6


def _project(project_dir: Path) -> dict:
    if not (project_dir / "Dockerfile").is_file():
        raise ImageError(f"{project_dir} has no Dockerfile: is it a project made by `enhydra new`?")
    pyproject = project_dir / "pyproject.toml"
    if not pyproject.is_file():
        raise ImageError(f"{project_dir} has no pyproject.toml")
    try:
        return tomllib.loads(pyproject.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ImageError(f"{pyproject} is not valid TOML: {exc}") from exc


def enhydra_checkout() -> Path | None:
    """The Enhydra source tree this package runs from (an editable install), if any."""
    return source_checkout()


def image_python(base: str) -> str:
    """`3.11` etc.: the Python of the base image, which the host wheels must match."""
    out = podman(
        "run", "--rm", "--network", "none", base, "python3", "-c",
        "import sys; print('%d.%d' % sys.version_info[:2])",
    ).stdout  # fmt: skip
    return out.strip().splitlines()[-1]


def host_python(version: str) -> str:
    """A host interpreter of the image's Python version, to build wheels that fit it."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    if found is None:
        raise ImageError(
            f"the base image runs Python {version} but this is Python "
            f"{sys.version_info.major}.{sys.version_info.minor} and python{version} is not on "
            "PATH: wheels built here would not fit; install that Python or pass --python"
        )
    return found


def _copy_context(project_dir: Path, context: Path) -> None:
    """Copy the project into a staging build context, so the checkout is never written to."""
    top_level_skip = {".git", ".venv", "venv", "state", "wheelhouse", "build", "dist"}

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n == "__pycache__" or n.endswith("_cache")}
        if Path(directory) == project_dir:
            skipped |= top_level_skip & set(names)
        return skipped

    shutil.rmtree(context, ignore_errors=True)
    shutil.copytree(project_dir, context, ignore=ignore, symlinks=True)


def build(
    project_dir: Path,
    *,
    tag: str | None = None,
    base: str = BASE_IMAGE,
    enhydra_source: Path | None = None,
    python: str | None = None,
    output: Output | None = None,
) -> Built:
    """Build PROJECT_DIR's Dockerfile on `base` from a host-made wheelhouse, with no network.

    `output` receives the commands run and their output (pip's, podman's) as they come.
    """
    project_dir = project_dir.resolve()
    meta = _project(project_dir).get("project", {})
    name = meta.get("name")
    if not name:
        raise ImageError(f"{project_dir / 'pyproject.toml'} has no [project] name")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    tag = tag or f"localhost/{slug}:{meta.get('version', 'dev')}"
    if not image_exists(base):
        raise ImageError(f"base image {base} is missing: run `enhydra image prepare`")
    vendored = vendored_wheel(project_dir)
    if vendored is not None and enhydra_source is not None:
        raise ImageError(
            f"{project_dir} carries its Enhydra ({vendored.relative_to(project_dir)}): drop "
            "--enhydra, or put another one there with `enhydra upgrade-runtime`"
        )
    # A project that vendors its runtime builds with that one, never with this checkout.
    source = enhydra_source or (None if vendored else enhydra_checkout())
    build_dir = cache_root() / "build" / slug
    context = build_dir / "context"
    wheelhouse = context / "wheelhouse"
    log = build_dir / "build.log"

    with _locked(f"build-{slug}"):
        started = time.monotonic()
        _copy_context(project_dir, context)
        wheelhouse.mkdir(parents=True, exist_ok=True)
        build_system = _project(project_dir).get("build-system", {})
        requires = build_system.get("requires", ["setuptools", "wheel"])
        python = python or host_python(image_python(base))
        cmd = [python, "-m", "pip", "wheel", "--progress-bar", "off"]
        cmd += ["--wheel-dir", str(wheelhouse)]
        if (project_dir / "wheelhouse").is_dir():
            cmd += ["--find-links", str(project_dir / "wheelhouse")]  # wheels the user supplied
        cmd += [str(project_dir), *requires]
        if source is not None:
            cmd.append(str(source))
        _run(
            cmd,
            what="making the wheelhouse",
            timeout=900,
            log=build_dir / "wheelhouse.log",
            output=output,
        )
        # The project itself is built inside the image from its source, as a user's build does.
        wheel_prefix = re.sub(r"[-_.]+", "_", name).lower() + "-"
        for wheel in wheelhouse.glob("*.whl"):
            if wheel.name.lower().startswith(wheel_prefix):
                wheel.unlink()
        wheelhouse_seconds = time.monotonic() - started

        # --layers=false: the wheelhouse differs on almost every build, so cached layers would
        # only pile up (about 600 MB a build); the steps before it take seconds.
        cmd = [
            "podman", "build", "--format", "docker", "--network", "none", "--layers=false",
            "--build-arg", f"BASE={base}", "--build-arg", "PIP_NO_INDEX=1",
            "--tag", tag, "--file", str(context / "Dockerfile"), str(context),
        ]  # fmt: skip
        previous = _image_id(tag)
        image_started = time.monotonic()
        _run(cmd, what=f"building {tag}", timeout=1200, log=log, output=output)
        image_seconds = time.monotonic() - image_started
        if previous and previous != _image_id(tag):
            # The image this tag named before is now nameless: drop it unless a container uses it.
            podman("rmi", previous, check=False)
    return Built(
        tag=tag,
        size_bytes=image_size(tag),
        seconds=wheelhouse_seconds + image_seconds,
        wheelhouse_seconds=wheelhouse_seconds,
        image_seconds=image_seconds,
        log=log,
    )


# --------------------------------------------------------------------------- run / stop / logs


@dataclass
class Container:
    """One running instance: its container, the port it answers on, its state volume."""

    name: str
    instance_id: str
    zone: str
    port: int
    volume: str
    image: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Stopped:
    name: str
    seconds: float
    exit_code: int


def container_env(
    *,
    bootstrap: str,
    instance_id: str,
    zone: str,
    port: int,
    app_id: str | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Settings of one instance on the host network: its own port, advertised on loopback."""
    env = {
        "ENHYDRA_BOOTSTRAP_SERVERS": bootstrap,
        "ENHYDRA_INSTANCE_ID": instance_id,
        "ENHYDRA_CLIENT_TAGS": f"zone={zone}",
        "ENHYDRA_WEB_HOST": "127.0.0.1",
        "ENHYDRA_WEB_PORT": str(port),
        "ENHYDRA_ADVERTISED_URL": f"http://127.0.0.1:{port}",
    }
    if app_id:
        env["ENHYDRA_APP_ID"] = app_id
    return {**env, **(extra or {})}


def start_container(
    image: str,
    *,
    name: str,
    group: str,
    volume: str,
    env: dict[str, str],
    stop_timeout: int = STOP_GRACE_S,
) -> None:
    """`podman run -d` on the host network; replaces a stopped container of the same name.

    The named volume is created on first use with the image's ownership of STATE_DIR, and
    survives the container: a new container on it restores only the changelog tail. The root
    filesystem is read-only and capabilities are dropped, as the Kubernetes manifests ask.
    """
    args = ["run", "--detach", "--replace", "--name", name, "--network", "host"]
    args += ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    args += ["--label", f"{GROUP_LABEL}={group}", "--stop-timeout", str(stop_timeout)]
    args += ["--volume", f"{volume}:{STATE_DIR}"]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    podman(*args, image)


def run_containers(
    image: str,
    *,
    count: int,
    bootstrap: str,
    name: str,
    port: int = 6066,
    zones: Sequence[str] = ("a", "b"),
    app_id: str | None = None,
    extra_env: dict[str, str] | None = None,
    stop_timeout: int = STOP_GRACE_S,
) -> list[Container]:
    """Start COUNT instances: NAME-1..N, ports PORT.., zones round-robin, volumes NAME-i-state."""
    if count < 1:
        raise ImageError(f"--count must be at least 1, got {count}")
    if not zones:
        raise ImageError("at least one zone is needed")
    if not image_exists(image):
        raise ImageError(f"image {image} not found: build it with `enhydra image build`")
    containers = []
    for i in range(1, count + 1):
        c = Container(
            name=f"{name}-{i}",
            instance_id=f"{name}-{i}",
            zone=zones[(i - 1) % len(zones)],
            port=port + i - 1,
            volume=f"{name}-{i}-state",
            image=image,
        )
        env = container_env(
            bootstrap=bootstrap,
            instance_id=c.instance_id,
            zone=c.zone,
            port=c.port,
            app_id=app_id,
            extra=extra_env,
        )
        start_container(
            image, name=c.name, group=name, volume=c.volume, env=env, stop_timeout=stop_timeout
        )
        containers.append(c)
    return containers


def state(name: str) -> tuple[str, int]:
    """(status, exit code) of a container, e.g. ("running", 0) or ("exited", 0)."""
    out = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).stdout
    status, code = out.split()
    return status, int(code)


def logs(name: str, tail: int | None = None) -> str:
    args = ["logs", *(["--tail", str(tail)] if tail else []), name]
    result = podman(*args)
    return result.stdout + result.stderr


def wait_ready(container: Container, timeout: float = 120.0) -> float:
    """Wait for /health/ready, then check the image's own HEALTHCHECK agrees; return seconds.

    Podman runs HEALTHCHECKs on a timer only under systemd, so the check is run on demand.
    """
    started = time.monotonic()
    deadline = started + timeout
    while True:
        status, code = state(container.name)
        if status not in ("running", "created", "configured", "initialized"):
            raise ImageError(
                f"{container.name} is {status} (exit {code}) before it was ready:\n"
                + logs(container.name, tail=40)
            )
        try:
            with urllib.request.urlopen(container.url + "/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ImageError(
                f"{container.name} not ready after {timeout:.0f}s:\n"
                + logs(container.name, tail=40)
            )
        time.sleep(0.3)
    check = podman("healthcheck", "run", container.name, check=False)
    if check.returncode != 0:
        raise ImageError(
            f"{container.name} answers /health/ready but its HEALTHCHECK says "
            f"{(check.stdout + check.stderr).strip() or 'unhealthy'} (exit {check.returncode})"
        )
    return time.monotonic() - started


def group_members(group: str) -> list[str]:
    out = podman(
        "ps", "--all", "--filter", f"label={GROUP_LABEL}={group}", "--format", "{{.Names}}"
    ).stdout
    return sorted(out.split())


def stop(name: str, timeout: int = STOP_GRACE_S) -> Stopped:
    """`podman stop` (SIGTERM, SIGKILL after `timeout` s); how long it took and the exit code."""
    started = time.monotonic()
    podman("stop", "--time", str(timeout), name, timeout=timeout + 60)
    seconds = time.monotonic() - started
    _, code = state(name)
    return Stopped(name, seconds, code)


def remove(names: Sequence[str], *, volumes: Sequence[str] = ()) -> None:
    """Remove containers (forcefully) and then the given volumes; missing ones are fine."""
    if names:
        podman("rm", "--force", "--ignore", *names, timeout=120)
    for volume in volumes:
        podman("volume", "rm", "--force", volume, check=False)


def volume_of(name: str) -> str | None:
    out = podman("inspect", "--format", "{{json .Mounts}}", name).stdout
    for mount in json.loads(out or "[]") or []:
        if mount.get("Destination") == STATE_DIR and mount.get("Name"):
            return mount["Name"]
    return None
