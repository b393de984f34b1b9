"""`enhydra image ...`: a thin shell over enhydra.devtools.image (podman, the image recipe).

Results for scripts (`image=...`, `base=...`) go to stdout; the steps and their output (apt,
debootstrap, pip, podman) stream to stderr as they run, unless --quiet.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

import click

from enhydra.cli.common import app_option
from enhydra.cli.extras import require_dev_tools
from enhydra.devtools import image as recipe
from enhydra.devtools.broker import LocalBroker


def _fail(exc: recipe.ImageError) -> click.ClickException:
    return click.ClickException(str(exc))


def _note(message: str) -> None:
    click.echo(f"enhydra: {message}", err=True)


def _output(quiet: bool) -> recipe.Output | None:
    """Where a step's output goes: stderr line by line, or nowhere with --quiet."""
    return None if quiet else (lambda line: click.echo(line, err=True))


QUIET = click.option(
    "--quiet", "-q", is_flag=True, help="Only the result: no step output (it is still logged)."
)


@click.group("image")
def image() -> None:
    """Build a service's container image and run a few of it locally, with podman.

    \b
    Example:
      enhydra image prepare && enhydra image build . && enhydra image run localhost/billing:0.1.0
    """
    require_dev_tools("image")


@image.command("prepare")
@click.option(
    "--base", default=recipe.BASE_IMAGE, show_default=True, help="Name of the base image."
)
@click.option(
    "--suite", default=recipe.SUITE, show_default=True, help="Debian release of the base."
)
@click.option(
    "--mirror", default=recipe.MIRROR, show_default=True, help="Debian mirror for debootstrap."
)
@QUIET
def prepare_cmd(base: str, suite: str, mirror: str, quiet: bool) -> None:
    """Install podman + runc (Debian, as root), write containers.conf, make the base image.

    Idempotent: the base image is made once with debootstrap (minutes) and kept as a tarball,
    so later machines import it in seconds.

    \b
    Example:
      sudo .venv/bin/enhydra image prepare
    """
    try:
        done = recipe.prepare(base, suite=suite, mirror=mirror, output=_output(quiet))
    except recipe.ImageError as exc:
        raise _fail(exc) from exc
    if done.installed:
        _note(f"installed {' '.join(done.installed)}")
    _note(f"base image {done.base} ({done.base_from}) in {done.seconds:.1f}s")
    click.echo(f"containers_conf={recipe.conf_path()}")
    click.echo(f"base={done.base}")


@image.command("env")
def env_cmd() -> None:
    """Print `export CONTAINERS_CONF=...`, to use podman by hand with the same settings.

    \b
    Example:
      eval "$(enhydra image env)" && podman ps
    """
    click.echo(f"export CONTAINERS_CONF={shlex.quote(str(recipe.write_conf()))}")


@image.command("build")
@click.argument(
    "project_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default="."
)
@click.option("--tag", help="Image name [default: localhost/<project>:<version>].")
@click.option("--base", default=recipe.BASE_IMAGE, show_default=True, help="Build argument BASE.")
@click.option(
    "--enhydra",
    "enhydra_source",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Enhydra source tree to put in the wheelhouse [default: the project's vendor/ wheel, "
    "else this checkout if editable, else the index].",
)
@click.option("--python", help="Host Python to build wheels with [default: one matching BASE].")
@QUIET
def build_cmd(
    project_dir: Path,
    tag: str | None,
    base: str,
    enhydra_source: Path | None,
    python: str | None,
    quiet: bool,
) -> None:
    """Build PROJECT_DIR's image from a host-made wheelhouse, with no network in the build.

    pip's and podman's output streams to stderr as the build runs.

    \b
    Example:
      enhydra image build ~/src/billing --tag localhost/billing:dev
    """
    try:
        built = recipe.build(
            project_dir,
            tag=tag,
            base=base,
            enhydra_source=enhydra_source,
            python=python,
            output=_output(quiet),
        )
    except recipe.ImageError as exc:
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
    envvar="ENHYDRA_BOOTSTRAP_SERVERS",
    show_envvar=True,
    metavar="HOST:PORT[,...]",
    help="Kafka bootstrap servers reachable from the host network [default: the broker of "
    "`enhydra kafka start`]. Security settings go in with --env.",
)
@click.option("--name", help="Container name prefix and group [default: the image's name].")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=6066, show_default=True,
    help="Web port of the first instance; the next ones count up.",
)  # fmt: skip
@click.option("--zones", default="a,b", show_default=True, help="Zone tags, round-robin.")
@app_option(required=False, help="The application id [default: the service's own].")
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
    """Run COUNT containers of IMAGE on the host network, each with its own state volume.

    \b
    Example:
      enhydra image run localhost/billing:0.1.0 --count 3 -e ENHYDRA_NUM_STANDBY_REPLICAS=1
    """
    extra = _parse_env(env)
    if bootstrap is None:
        info = LocalBroker().status()
        if info is None:
            raise click.UsageError("no broker found: run `enhydra kafka start` or pass --bootstrap")
        bootstrap = info.bootstrap
    name = name or image_ref.rsplit("/", 1)[-1].split(":", 1)[0]
    try:
        containers = recipe.run_containers(
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
                seconds = recipe.wait_ready(c)
                _note(f"{c.name} ready in {seconds:.1f}s")
            click.echo(f"{c.name} url={c.url} zone={c.zone} volume={c.volume}")
    except recipe.ImageError as exc:
        raise _fail(exc) from exc


@image.command("stop")
@click.argument("names", nargs=-1)
@click.option("--group", help="Stop every container `enhydra image run --name GROUP` started.")
@click.option(
    "--time", "grace", type=click.IntRange(0), default=recipe.STOP_GRACE_S, show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)  # fmt: skip
@click.option(
    "--remove", "remove_after", is_flag=True, help="Remove the containers after they stopped."
)
@click.option("--volumes", is_flag=True, help="With --remove: remove their state volumes too.")
def stop_cmd(
    names: Sequence[str], group: str | None, grace: int, remove_after: bool, volumes: bool
) -> None:
    """Stop containers gracefully; print each one's shutdown time and exit code.

    \b
    Examples:
      enhydra image stop billing-1
      enhydra image stop --group billing --remove --volumes
    """
    if not names and not group:
        raise click.UsageError("name containers to stop, or pass --group")
    try:
        targets = list(names) + (recipe.group_members(group) if group else [])
        if not targets:
            raise click.ClickException(f"no containers in group {group!r}")
        failed = False
        kept_volumes = []
        for name in targets:
            kept_volumes.append(recipe.volume_of(name))
            done = recipe.stop(name, grace)
            failed |= done.exit_code != 0
            click.echo(f"{done.name} exit_code={done.exit_code} seconds={done.seconds:.2f}")
        if remove_after:
            recipe.remove(targets, volumes=[v for v in kept_volumes if v and volumes])
    except recipe.ImageError as exc:
        raise _fail(exc) from exc
    if failed:
        raise click.ClickException("some containers did not exit cleanly (see their logs)")


@image.command("logs")
@click.argument("name")
@click.option("--tail", type=click.IntRange(1), help="Only the last N lines.")
def logs_cmd(name: str, tail: int | None) -> None:
    """Print a container's log (JSON lines with ENHYDRA_LOG_FORMAT=json).

    \b
    Example:
      enhydra image logs billing-1 --tail 20
    """
    try:
        click.echo(recipe.logs(name, tail), nl=False)
    except recipe.ImageError as exc:
        raise _fail(exc) from exc
