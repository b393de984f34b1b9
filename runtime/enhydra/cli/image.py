"""`enhydra image ...`: build a service's container image and run a few of it, with podman.

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

The functions are the API (tests/containers uses them); the click commands are thin.
"""

from __future__ import annotations

import contextlib
import fcntl
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from enhydra.broker.local import LocalBroker, cache_root
from enhydra.scaffold import source_checkout, vendored_wheel

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
    path = cache_root() / "locks" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(cmd: Sequence[str], *, what: str, timeout: float, log: Path | None = None) -> None:
    """Run a host command; on failure raise with its output tail (full output in `log`)."""
    try:
        result = subprocess.run(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
            env=podman_env(),
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{what}: `{shlex.join(cmd)}` took longer than {timeout:.0f}s") from exc
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(result.stdout)
    if result.returncode != 0:
        where = f" (full output: {log})" if log else ""
        tail = "\n".join(result.stdout.splitlines()[-30:])
        raise ImageError(f"{what} failed (exit {result.returncode}){where}:\n{tail}")


# --------------------------------------------------------------------------- prepare


@dataclass
class Prepared:
    installed: list[str]
    base: str
    base_from: str  # "existing", "cache" or "debootstrap"
    seconds: float


def _apt_install(packages: list[str]) -> None:
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
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ImageError(f"`{shlex.join(cmd)}` failed: {result.stderr.strip()[-1500:]}")


def base_tarball(suite: str = SUITE) -> Path:
    return cache_root() / "images" / f"enhydra-base-{suite}.tar"


def _debootstrap(suite: str, mirror: str, tarball: Path) -> None:
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
        )
        partial.rename(tarball)  # atomic: an interrupted run never leaves a half tarball
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prepare(base: str = BASE_IMAGE, *, suite: str = SUITE, mirror: str = MIRROR) -> Prepared:
    """Install what is missing, write containers.conf, make or reuse the base image. Idempotent."""
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
        _apt_install(missing)

        if not need_base:
            base_from = "existing"
        else:
            base_from = "cache" if tarball.exists() else "debootstrap"
            if not tarball.exists():
                tarball.parent.mkdir(parents=True, exist_ok=True)
                _debootstrap(suite, mirror, tarball)
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
    echo: bool = False,
) -> Built:
    """Build PROJECT_DIR's Dockerfile on `base` from a host-made wheelhouse, with no network."""
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
        cmd = [python, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheelhouse)]
        if (project_dir / "wheelhouse").is_dir():
            cmd += ["--find-links", str(project_dir / "wheelhouse")]  # wheels the user supplied
        cmd += [str(project_dir), *requires]
        if source is not None:
            cmd.append(str(source))
        if echo:
            click.echo(f"enhydra: wheelhouse: {shlex.join(cmd)}", err=True)
        _run(cmd, what="making the wheelhouse", timeout=900, log=build_dir / "wheelhouse.log")
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
        if echo:
            click.echo(f"enhydra: image: {shlex.join(cmd)}", err=True)
        previous = _image_id(tag)
        image_started = time.monotonic()
        _run(cmd, what=f"building {tag}", timeout=1200, log=log)
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


# --------------------------------------------------------------------------- CLI


def _fail(exc: ImageError) -> click.ClickException:
    return click.ClickException(str(exc))


def _note(message: str) -> None:
    click.echo(f"enhydra: {message}", err=True)


@click.group("image")
def image() -> None:
    """Build a service's container image and run a few of it locally, with podman."""


@image.command("prepare")
@click.option("--base", default=BASE_IMAGE, show_default=True, help="Name of the base image.")
@click.option("--suite", default=SUITE, show_default=True, help="Debian release of the base.")
@click.option("--mirror", default=MIRROR, show_default=True, help="Debian mirror for debootstrap.")
def prepare_cmd(base: str, suite: str, mirror: str) -> None:
    """Install podman + runc (Debian, as root), write containers.conf, make the base image."""
    try:
        done = prepare(base, suite=suite, mirror=mirror)
    except ImageError as exc:
        raise _fail(exc) from exc
    if done.installed:
        _note(f"installed {' '.join(done.installed)}")
    _note(f"base image {done.base} ({done.base_from}) in {done.seconds:.1f}s")
    click.echo(f"containers_conf={conf_path()}")
    click.echo(f"base={done.base}")


@image.command("env")
def env_cmd() -> None:
    """Print `export CONTAINERS_CONF=...`, to use podman by hand with the same settings."""
    click.echo(f"export CONTAINERS_CONF={shlex.quote(str(write_conf()))}")


@image.command("build")
@click.argument(
    "project_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default="."
)
@click.option("--tag", help="Image name [default: localhost/<project>:<version>].")
@click.option("--base", default=BASE_IMAGE, show_default=True, help="Build argument BASE.")
@click.option(
    "--enhydra",
    "enhydra_source",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Enhydra source tree to put in the wheelhouse [default: this checkout, if editable; "
    "else Enhydra comes from the index].",
)
@click.option("--python", help="Host Python to build wheels with [default: one matching BASE].")
def build_cmd(
    project_dir: Path,
    tag: str | None,
    base: str,
    enhydra_source: Path | None,
    python: str | None,
) -> None:
    """Build PROJECT_DIR's image from a host-made wheelhouse, with no network in the build."""
    try:
        built = build(
            project_dir,
            tag=tag,
            base=base,
            enhydra_source=enhydra_source,
            python=python,
            echo=True,
        )
    except ImageError as exc:
        raise _fail(exc) from exc
    _note(
        f"built {built.tag}: {built.size_mb:.0f} MB in {built.seconds:.1f}s "
        f"(wheelhouse {built.wheelhouse_seconds:.1f}s, image {built.image_seconds:.1f}s)"
    )
    click.echo(f"image={built.tag}")
    click.echo(f"size_bytes={built.size_bytes}")
    click.echo(f"build_seconds={built.seconds:.1f}")


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--env")
        env[key] = value
    return env


@image.command("run")
@click.argument("image_ref", metavar="IMAGE")
@click.option("--count", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option(
    "--bootstrap",
    help="Kafka bootstrap servers reachable from the host network [default: the broker of "
    "`enhydra kafka start`].",
)
@click.option("--name", help="Container name prefix and group [default: the image's name].")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=6066, show_default=True,
    help="Web port of the first instance; the next ones count up.",
)  # fmt: skip
@click.option("--zones", default="a,b", show_default=True, help="Zone tags, round-robin.")
@click.option("--app-id", help="ENHYDRA_APP_ID [default: the service's own].")
@click.option("--env", "-e", "env", multiple=True, help="Extra KEY=VALUE setting (repeatable).")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until ready.")
def run_cmd(
    image_ref: str,
    count: int,
    bootstrap: str | None,
    name: str | None,
    port: int,
    zones: str,
    app_id: str | None,
    env: Sequence[str],
    wait: bool,
) -> None:
    """Run COUNT containers of IMAGE on the host network, each with its own state volume."""
    extra = _parse_env(env)
    if bootstrap is None:
        info = LocalBroker().status()
        if info is None:
            raise click.UsageError("no broker found: run `enhydra kafka start` or pass --bootstrap")
        bootstrap = info.bootstrap
    name = name or image_ref.rsplit("/", 1)[-1].split(":", 1)[0]
    try:
        containers = run_containers(
            image_ref,
            count=count,
            bootstrap=bootstrap,
            name=name,
            port=port,
            zones=[z.strip() for z in zones.split(",") if z.strip()],
            app_id=app_id,
            extra_env=extra,
        )
        for c in containers:
            if wait:
                seconds = wait_ready(c)
                _note(f"{c.name} ready in {seconds:.1f}s")
            click.echo(f"{c.name} url={c.url} zone={c.zone} volume={c.volume}")
    except ImageError as exc:
        raise _fail(exc) from exc


@image.command("stop")
@click.argument("names", nargs=-1)
@click.option("--group", help="Stop every container `enhydra image run --name GROUP` started.")
@click.option(
    "--time", "grace", type=click.IntRange(0), default=STOP_GRACE_S, show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)  # fmt: skip
@click.option(
    "--remove", "remove_after", is_flag=True, help="Remove the containers after they stopped."
)
@click.option("--volumes", is_flag=True, help="With --remove: remove their state volumes too.")
def stop_cmd(
    names: Sequence[str], group: str | None, grace: int, remove_after: bool, volumes: bool
) -> None:
    """Stop containers gracefully; print each one's shutdown time and exit code."""
    try:
        targets = list(names) + (group_members(group) if group else [])
        if not targets:
            raise click.UsageError("name containers to stop, or pass --group")
        failed = False
        kept_volumes = []
        for name in targets:
            kept_volumes.append(volume_of(name))
            done = stop(name, grace)
            failed |= done.exit_code != 0
            click.echo(f"{done.name} exit_code={done.exit_code} seconds={done.seconds:.2f}")
        if remove_after:
            remove(targets, volumes=[v for v in kept_volumes if v and volumes])
    except ImageError as exc:
        raise _fail(exc) from exc
    if failed:
        raise click.ClickException("some containers did not exit cleanly (see their logs)")


@image.command("logs")
@click.argument("name")
@click.option("--tail", type=click.IntRange(1), help="Only the last N lines.")
def logs_cmd(name: str, tail: int | None) -> None:
    """Print a container's log (JSON lines with ENHYDRA_LOG_FORMAT=json)."""
    try:
        click.echo(logs(name, tail), nl=False)
    except ImageError as exc:
        raise _fail(exc) from exc
