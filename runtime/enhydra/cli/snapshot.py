"""`enhydra snapshot`: take, list, verify, query, clone, restore, and time-travel snapshots."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import click

from enhydra.cli.common import kafka_options
from enhydra.cli.run import load_service
from enhydra.contracts.codec import decode_entry
from enhydra.settings import Connection
from enhydra.snapshots.format import SnapshotError, open_snapshot, topology_fingerprint
from enhydra.snapshots.offline import clone, request_snapshot, restore, snapshot_at
from enhydra.snapshots.storage import open_snapshot_at, open_storage

BOOTSTRAP = kafka_options
STORAGE = click.option(
    "--storage",
    envvar="ENHYDRA_SNAPSHOT_STORAGE",
    required=True,
    help="A folder, file://..., or s3://bucket/prefix?endpoint_url=...",
)


def _open(location: str, *, service: str | None = None, force: bool = False):
    """A snapshot from a folder, or `<storage url>#<snapshot id>` for remote storage."""
    storage_url, sep, snapshot_id = location.partition("#")
    try:
        if sep:
            directory = open_snapshot_at(open_storage(storage_url), snapshot_id)
        else:
            directory = Path(location)
        expected = None
        if service is not None:
            snap = open_snapshot(directory, verify=False)
            svc = load_service(service)
            bound = svc.bound
            expected = topology_fingerprint(
                app_id=snap.manifest.app_id,
                store=bound.name,
                partitions=svc.settings.partitions,
                commands_topic=snap.manifest.cut.topic,
                changelog_topic=f"{snap.manifest.app_id}-{bound.name}-changelog",
            )
        return open_snapshot(directory, expected, force=force)
    except SnapshotError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
def snapshot() -> None:
    """Consistent snapshots of an application's state, clones and time travel."""


@snapshot.command()
@click.option("--app", "app_id", required=True)
@BOOTSTRAP
@STORAGE
@click.option("--timeout", default=300.0, show_default=True)
def create(app_id: str, conn: Connection, storage: str, timeout: float) -> None:
    """Ask the running application for a consistent snapshot and wait for it."""
    with click.progressbar(length=0, label="partitions written", show_pos=True) as bar:

        def progress(part: dict) -> None:
            bar.length = part["partitions"]
            bar.update(1)

        try:
            done = asyncio.run(
                request_snapshot(conn, app_id, storage, timeout=timeout, progress=progress)
            )
        except SnapshotError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps({k: done[k] for k in ("id", "storage", "rows", "cut", "seconds")}))


@snapshot.command("list")
@STORAGE
def list_(storage: str) -> None:
    """Complete snapshots in a storage (those with a manifest)."""
    for snapshot_id in open_storage(storage).list_snapshots():
        click.echo(snapshot_id)


@snapshot.command()
@click.argument("location")
@click.option("--service", help="MODULE:ATTR to check the topology fingerprint against.")
@click.option("--force", is_flag=True, help="Accept a foreign topology fingerprint.")
def verify(location: str, service: str | None, force: bool) -> None:
    """Check a snapshot: manifest, every file's size and sha256, the fingerprint."""
    snap = _open(location, service=service, force=force)
    m = snap.manifest
    click.echo(
        f"ok: {m.app_id}/{m.store}, {len(m.partitions)} partitions, {m.rows} rows, "
        f"cut {m.cut.to_json()}"
    )


@snapshot.command()
@click.argument("location")
@click.argument("store")
@click.argument("key")
def query(location: str, store: str, key: str) -> None:
    """Print one key's state from a snapshot."""
    snap = _open(location)
    if store != snap.manifest.store:
        raise click.ClickException(
            f"no store {store!r} in this snapshot (it holds {snap.manifest.store!r})"
        )
    raw = snap.lookup(key)
    if raw is None:
        raise click.ClickException(f"no key {key!r} in {store}")
    click.echo(json.dumps(decode_entry(raw).state))


def _bar(label: str, total: int):
    return click.progressbar(length=total, label=label, show_pos=True)


@snapshot.command("clone")
@click.argument("location")
@click.option("--to-app", required=True, help="The new application's id.")
@click.option("--commands-topic", help="Input of the clone (default: the source's, from the cut).")
@click.option("--service", help="MODULE:ATTR the clone will run, to check the fingerprint.")
@click.option("--force", is_flag=True)
@BOOTSTRAP
def clone_(
    location: str,
    to_app: str,
    commands_topic: str | None,
    service: str | None,
    force: bool,
    conn: Connection,
) -> None:
    """Start a new application from a snapshot (pre-deploy tests, blue/green)."""
    snap = _open(location, service=service, force=force)
    with _bar("loading state", snap.manifest.rows) as bar:
        try:
            result = asyncio.run(
                clone(
                    snap,
                    conn=conn,
                    to_app=to_app,
                    commands_topic=commands_topic,
                    progress=bar.update,
                )
            )
        except SnapshotError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"cloned {result.rows} rows into {result.changelog_topic}")
    if result.resumes_at_cut:
        click.echo(f"group {to_app} starts {result.commands_topic} at {result.offsets}")
    click.echo(
        f"run it with ENHYDRA_APP_ID={to_app} ENHYDRA_COMMANDS_TOPIC={result.commands_topic}"
    )


@snapshot.command("restore")
@click.argument("location")
@click.option("--app", "app_id", required=True)
@click.option("--service", help="MODULE:ATTR to check the fingerprint against.")
@click.option("--force", is_flag=True)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@BOOTSTRAP
def restore_(
    location: str, app_id: str, service: str | None, force: bool, yes: bool, conn: Connection
) -> None:
    """Bring an application back to a snapshot (its instances stopped; wipe their state dirs)."""
    snap = _open(location, service=service, force=force)
    if not yes:
        click.confirm(
            f"replace {app_id}'s state with {snap.manifest.rows} rows from the "
            "snapshot and rewind its group to the cut?",
            abort=True,
        )
    with _bar("restoring state", snap.manifest.rows) as bar:
        try:
            result = asyncio.run(restore(snap, conn=conn, app_id=app_id, progress=bar.update))
        except SnapshotError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(
        f"restored {result.rows} rows into {result.changelog_topic}; group {app_id} "
        f"rewound to {result.offsets}. Wipe the instances' state dirs before starting."
    )


@snapshot.command("at")
@click.option("--service", "target", required=True, help="MODULE:ATTR whose apply is used.")
@click.option("--app", "app_id", help="Application id (default: the service's).")
@click.option("--time", "when", required=True, help="ISO time, e.g. 2026-11-22T10:00:00Z.")
@click.option("--output", type=click.Path(path_type=Path), required=True)
@BOOTSTRAP
def at(target: str, app_id: str | None, when: str, output: Path, conn: Connection) -> None:
    """Build the snapshot as of a time by replaying the events topic through `apply`."""
    try:
        until = dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{when!r}: expected an ISO time") from None
    if until.tzinfo is None:
        until = until.replace(tzinfo=dt.UTC)
    svc = load_service(target)
    app = app_id or svc.settings.app_id
    bound = svc.aggregate.bind(app)
    with click.progressbar(length=0, label="events read", show_pos=True) as bar:
        try:
            manifest = asyncio.run(
                snapshot_at(
                    bound,
                    conn=conn,
                    app_id=app,
                    until=until,
                    output=output,
                    progress=bar.update,
                )
            )
        except SnapshotError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"snapshot as of {until.isoformat()}: {manifest.rows} keys in {output}")
