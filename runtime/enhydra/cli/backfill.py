"""`enhydra backfill TARGET ...`: rebuild a service's state from its events, locally.

The options are the job's own (`jobs/backfill.py` takes the same ones), so `enhydra backfill
--help` and `python jobs/backfill.py --help` say the same thing; Spark runs with local[*]
unless --master says otherwise.
"""

from __future__ import annotations

import click


@click.command(
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def backfill(args: tuple[str, ...]) -> None:
    """Rebuild TARGET's state from its events topic with PySpark (see --help)."""
    try:
        from enhydra.spark.job import main
    except ImportError as exc:
        raise click.ClickException(
            f"the backfill needs PySpark: pip install 'enhydra[spark]' ({exc})"
        ) from exc
    main(argv=list(args))
