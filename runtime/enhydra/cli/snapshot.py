"""`enhydra snapshot`: take, list, verify, query, clone, restore, and time-travel snapshots."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from pathlib import Path

import click

from enhydra.cli.common import (
    EXIT_NOTHING,
    StatusLine,
    app_option,
    deprecated_option,
    kafka_options,
    load_service,
    target_or_alias,
)
from enhydra.cli.project import project_service
from enhydra.contracts.codec import decode_entry
from enhydra.contracts.fingerprint import accepted_store_fingerprints
from enhydra.service import Service
from enhydra.settings import Connection, SettingsError, control_secret_from_env
from enhydra.snapshots.format import SnapshotError, open_snapshot
from enhydra.snapshots.offline import clone, request_snapshot, restore, snapshot_at
from enhydra.snapshots.storage import FileStorage, S3Storage, open_snapshot_at, open_storage

STORAGE_HELP = "A folder, file://..., or s3://bucket/prefix?endpoint_url=..."
STORAGE = click.option(
    "--storage",
    envvar="ENHYDRA_SNAPSHOT_STORAGE",
    show_envvar=True,
    required=True,
    metavar="URL",
    help=STORAGE_HELP,
)
LOCATION = click.argument("location", metavar="SNAPSHOT")
# TARGET used to be given as --service MODULE:ATTR; scripts that still do keep working.
SERVICE_ALIAS = deprecated_option(
    "--service", "service_alias", "pass MODULE:ATTR as the TARGET argument"
)


def _storage(url: str, *, must_exist: bool) -> FileStorage | S3Storage:
    """The storage at `url`, refused before anything else runs when it cannot be right."""
    try:
        storage = open_storage(url)
    except SnapshotError as exc:
        raise click.BadParameter(str(exc), param_hint="--storage") from None
    if must_exist and isinstance(storage, FileStorage) and not storage.root.is_dir():
        what = "not a folder" if storage.root.exists() else "no such folder"
        raise click.BadParameter(f"{url}: {what}", param_hint="--storage")
    return storage


def describe_progress(state: dict) -> str:
    """One line per update: how many partitions are written, and each one's state."""
    parts = state["partitions"]
    shown = []
    for p, info in sorted(parts.items(), key=lambda item: int(item[0])):
        if info["state"] == "written":
            shown.append(f"p{p} written by {info['by']} at {info['cut']}")
        elif info["state"] == "cutting":
            shown.append(f"p{p} cutting at {info['cut']} on {info['by']}")
        else:
            shown.append(f"p{p} waiting" + (f" for {info['owner']}" if info.get("owner") else ""))
    return f"snapshot {state['id']}: {state['written']}/{len(parts)} written; " + ", ".join(shown)


def _service(target: str | None, alias: str | None) -> Service | None:
    target = target_or_alias(target, alias, "--service")
    return load_service(target) if target is not None else None


def _open(location: str, *, service: Service | None = None, force: bool = False):
    """A snapshot from a folder, or `<storage url>#<snapshot id>` for remote storage."""
    storage_url, sep, snapshot_id = location.partition("#")
    try:
        if sep:
            directory = open_snapshot_at(_storage(storage_url, must_exist=True), snapshot_id)
        else:
            directory = Path(location)
            if not directory.exists():
                raise click.BadParameter(
                    f"{location}: no such folder (a snapshot's folder, or STORAGE#ID)",
                    param_hint="SNAPSHOT",
                )
        expected = None
        if service is not None:
            snap = open_snapshot(directory, verify=False)
            bound = service.bound
            expected = accepted_store_fingerprints(
                app_id=snap.manifest.app_id,
                store=bound.name,
                partitions=service.settings.partitions,
                commands_topic=snap.manifest.cut.topic,
                changelog_topic=bound.aggregate.bind(snap.manifest.app_id).changelog_topic,
            )
        return open_snapshot(directory, expected, force=force)
    except SnapshotError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
def snapshot() -> None:
    """Consistent snapshots of an application's state, clones and time travel.

    \b
    Example:
      enhydra snapshot create --app billing --storage /backups/snapshots
      enhydra snapshot list --storage /backups/snapshots
    """


@snapshot.command()
@app_option()
@kafka_options
@STORAGE
@click.option(
    "--timeout", default=300.0, show_default=True, help="Seconds to wait for the snapshot."
)
def create(app_id: str, conn: Connection, storage: str, timeout: float) -> None:
    """Ask the running application for a consistent snapshot and wait for it.

    Its instances cut every partition at one point of the input and write the files to
    STORAGE themselves, so STORAGE is where they can write (a shared folder, S3), and it
    must be the application's ENHYDRA_SNAPSHOT_STORAGE: they refuse any other. The request
    is signed with ENHYDRA_CONTROL_SECRET (or _FILE), as the instances' messages are. Prints
    the snapshot's id, rows and cut as JSON.

    \b
    Example:
      enhydra snapshot create --app billing --storage s3://backups/billing
    """
    _storage(storage, must_exist=False)
    try:
        secret = control_secret_from_env()  # the app's instances act on signed requests only
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    line = StatusLine(every_s=5.0)
    line.show(f"enhydra: asking {app_id}'s instances for a snapshot...", now=True)

    def progress(state: dict) -> None:
        line.show(f"enhydra: {describe_progress(state)}")

    try:
        done = asyncio.run(
            request_snapshot(
                conn, app_id, storage, timeout=timeout, progress=progress, secret=secret
            )
        )
    except SnapshotError as exc:
        line.flush()  # the last state of every partition belongs next to the error
        line.clear()
        raise click.ClickException(str(exc)) from exc
    line.flush()
    line.clear()
    click.echo(json.dumps({k: done[k] for k in ("id", "storage", "rows", "cut", "seconds")}))


@snapshot.command("list")
@STORAGE
def list_(storage: str) -> None:
    """Print the id of every complete snapshot in STORAGE (those with a manifest), oldest first.

    Exits 1 when STORAGE holds none, 2 when it does not exist.

    \b
    Example:
      enhydra snapshot list --storage /backups/snapshots | tail -1
    """
    found = _storage(storage, must_exist=True)
    ids = found.list_snapshots()
    if not ids:
        click.echo(
            f"no snapshots in {found.url} (take one with `enhydra snapshot create`)", err=True
        )
        sys.exit(EXIT_NOTHING)
    for snapshot_id in ids:
        click.echo(snapshot_id)


@snapshot.command()
@LOCATION
@click.argument("target", required=False)
@SERVICE_ALIAS
@click.option("--force", is_flag=True, help="Accept a foreign topology fingerprint.")
def verify(location: str, target: str | None, service_alias: str | None, force: bool) -> None:
    """Check a snapshot: manifest, every file's size and sha256, and with TARGET (MODULE:ATTR)
    that its topology fingerprint is the service's.

    SNAPSHOT is a snapshot's folder, or STORAGE#ID (an id `snapshot list` prints).

    \b
    Example:
      enhydra snapshot verify /backups/snapshots/billing-20261122T130501Z \\
        billing.service:service
    """
    snap = _open(location, service=_service(target, service_alias), force=force)
    m = snap.manifest
    click.echo(
        f"ok: {m.app_id}/{m.store}, {len(m.partitions)} partitions, {m.rows} rows, "
        f"cut {m.cut.to_json()}"
    )


@snapshot.command()
@LOCATION
@click.argument("store")
@click.argument("key")
def query(location: str, store: str, key: str) -> None:
    """Print one KEY's state in STORE from a snapshot; exit 1 when there is no such key.

    \b
    Example:
      enhydra snapshot query /backups/snapshots/billing-20261122T130501Z invoices inv-42
    """
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
    return click.progressbar(
        length=total,
        label=label,
        show_pos=True,
        show_percent=True,
        file=click.get_text_stream("stderr"),  # stdout is for the result lines
    )


@snapshot.command("clone")
@LOCATION
@click.argument("target", required=False)
@click.option("--to-app", required=True, help="The new application's id.")
@click.option("--commands-topic", help="Input of the clone (default: the source's, from the cut).")
@SERVICE_ALIAS
@click.option("--force", is_flag=True, help="Accept a foreign topology fingerprint.")
@kafka_options
def clone_(
    location: str,
    target: str | None,
    to_app: str,
    commands_topic: str | None,
    service_alias: str | None,
    force: bool,
    conn: Connection,
) -> None:
    """Start a new application from a snapshot (pre-deploy tests, blue/green).

    SNAPSHOT is a snapshot's folder, or STORAGE#ID. With TARGET (MODULE:ATTR, the service the
    clone will run) the snapshot's topology fingerprint is checked first.

    \b
    Example:
      enhydra snapshot clone /backups/snapshots/billing-20261122T130501Z \\
        billing.service:service --to-app billing-v2
    """
    snap = _open(location, service=_service(target, service_alias), force=force)
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
@LOCATION
@click.argument("target", required=False)
@app_option()
@SERVICE_ALIAS
@click.option("--force", is_flag=True, help="Accept a foreign topology fingerprint.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@kafka_options
def restore_(
    location: str,
    target: str | None,
    app_id: str,
    service_alias: str | None,
    force: bool,
    yes: bool,
    conn: Connection,
) -> None:
    """Bring an application back to a snapshot (its instances stopped; wipe their state dirs).

    SNAPSHOT is a snapshot's folder, or STORAGE#ID. With TARGET (MODULE:ATTR) the snapshot's
    topology fingerprint is checked first.

    \b
    Example:
      enhydra snapshot restore /backups/snapshots/billing-20261122T130501Z \\
        billing.service:service --app billing
    """
    snap = _open(location, service=_service(target, service_alias), force=force)
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
@click.argument("target", required=False)
@SERVICE_ALIAS
@app_option(required=False, help="Application id [default: TARGET's].")
@click.option(
    "--time", "when", required=True, metavar="ISO-TIME", help="e.g. 2026-11-22T10:00:00Z."
)
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    help="The folder the snapshot is written to.",
)
@kafka_options
def at(
    target: str | None,
    service_alias: str | None,
    app_id: str | None,
    when: str,
    output: Path,
    conn: Connection,
) -> None:
    """Build the snapshot as of a time by replaying the events topic through TARGET's `apply`
    (MODULE:ATTR; default: the service of the project around the current folder).

    \b
    Example:
      enhydra snapshot at billing.service:service --time 2026-11-22T10:00:00Z --output asof/
    """
    try:
        until = dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{when!r}: expected an ISO time", param_hint="--time") from None
    if until.tzinfo is None:
        until = until.replace(tzinfo=dt.UTC)
    svc = _service(target, service_alias) or project_service()
    if svc is None:
        raise click.UsageError(
            "Missing argument 'TARGET' (MODULE:ATTR of the service), or run inside the "
            "project made by `enhydra new`."
        )
    app = app_id or svc.settings.app_id
    bound = svc.aggregate.bind(app)
    line = StatusLine()
    read = 0

    def progress(count: int) -> None:
        nonlocal read
        read += count
        line.show(f"enhydra: {read:,} events read from {bound.events_topic}")

    try:
        manifest = asyncio.run(
            snapshot_at(bound, conn=conn, app_id=app, until=until, output=output, progress=progress)
        )
    except SnapshotError as exc:
        line.clear()
        raise click.ClickException(str(exc)) from exc
    line.clear()
    click.echo(f"snapshot as of {until.isoformat()}: {manifest.rows} keys in {output}")
