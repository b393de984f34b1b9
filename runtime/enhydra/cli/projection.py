"""`enhydra projection rebuild TARGET NAME`: a SQL projection's tables built again from the
events topic while the live ones serve, then swapped in (enhydra.sql.rebuild)."""

from __future__ import annotations

import asyncio

import click

from enhydra.cli.common import EXIT_KAFKA, EXIT_USAGE, StatusLine, fail, load_service
from enhydra.kafka.errors import KafkaAccessError


@click.group()
def projection() -> None:
    """Work on a service's projections (SQL projections: rebuild).

    \b
    Example:
      enhydra projection rebuild ledger.service:service balances
    """


@projection.command()
@click.argument("target")
@click.argument("name")
@click.option(
    "--batch-records",
    default=2000,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Events folded per transaction.",
)
def rebuild(target: str, name: str, batch_records: int) -> None:
    """Rebuild the SQL projection NAME of TARGET (MODULE:ATTR) into new tables from its events
    topic, with the projection's current code and DDL, while the live tables keep serving; then
    swap them in, in one transaction.

    Stopped (Ctrl-C, a crash), it resumes where it stopped when run again. After the swap,
    instances of the same version go on in the new tables; instances of an older version stop
    (deploy the new version next). The database is ENHYDRA_DATABASE_URL (and
    ENHYDRA_DATABASE_PASSWORD_FILE), Kafka the service's settings.

    \b
    Example:
      ENHYDRA_DATABASE_URL=postgresql://enhydra@db/reads \\
        enhydra projection rebuild ledger.service:service balances
    """
    from enhydra.sql.model import SqlProjection

    service = load_service(target)
    found = {p.name: p for p in service.projections if isinstance(p, SqlProjection)}
    chosen = found.get(name)
    if chosen is None:
        known = ", ".join(sorted(found)) or "none"
        fail([f"{target} has no SQL projection {name!r} (its SQL projections: {known})"], 1)
    try:
        from enhydra.sql.config import DatabaseConfigError, DatabaseSettings
        from enhydra.sql.rebuild import Progress, Rebuild, RebuildError
    except ImportError as exc:
        fail([f"{exc}", "install the postgres extra: pip install 'enhydra[postgres]'"], EXIT_USAGE)
    try:
        database = DatabaseSettings.from_env()
    except DatabaseConfigError as exc:
        fail([str(exc)], EXIT_USAGE)
    bound = service.bound
    line = StatusLine(every_s=5.0)
    line.show(f"enhydra: rebuilding {name} (version {chosen.version})...", now=True)

    def progress(state: Progress) -> None:
        rate = state.folded / state.seconds if state.seconds > 0 else 0.0
        where = "catching up with the live tables" if state.phase == "swap" else "filling"
        line.show(
            f"enhydra: {name}: {where}: {state.folded:,} events folded, "
            f"{state.behind:,} to go, {rate:,.0f}/s"
        )

    job = Rebuild(
        service.settings,
        database,
        chosen,
        bound.events_topic,
        aggregate=bound.aggregate,
        batch_records=batch_records,
        on_progress=progress,
    )
    try:
        positions = asyncio.run(job.run())
    except KafkaAccessError as exc:
        line.clear()
        fail(exc.lines(), EXIT_KAFKA, exc)
    except RebuildError as exc:
        line.clear()
        fail([str(exc)], 1, exc)
    except Exception as exc:  # the database refused: one line, the rebuild resumes when rerun
        line.clear()
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        fail(
            [f"the rebuild stopped: {type(exc).__name__}: {first}", "run it again to resume"],
            1,
            exc,
        )
    line.flush()
    seconds = line.clear()
    click.echo(
        f"{name}: rebuilt at version {chosen.version} and swapped in: {job.folded:,} events "
        f"folded in {seconds:.1f}s ({job.refused} refused), positions {positions}"
    )
