"""What a backfill sends to its executors, so a cluster needs only pyspark, pyarrow and orjson.

Executors run three things of ours: the fold (fold.py, with the service's `apply`), the
snapshot file writer (partition_files.py) and, without Spark's Kafka connector, the Python
reader and writer (source.py, sink.py). The job packs what they import into one zip and adds
it with `SparkContext.addPyFile` (what `spark-submit --py-files` does), on every master:

- the service's own package (the top-level package of the aggregate's functions, found from
  the functions themselves, so `ledger.domain.apply` ships `ledger/`);
- the handlers' packages too: an aggregate extended by `enhydra.plugins.extend` (a generated
  handler, an installed plugin) dispatches to functions of other modules;
- all of Enhydra's own sources, not a chosen part: Python takes a package whole from the
  first sys.path entry that has it, and Spark puts this zip in front, so a partial `enhydra`
  would hide the installed one's other modules from a service that imports them ("No module
  named 'enhydra.service'" for a one-module service). Whole, it is the very runtime that
  planned the job, whatever copy the worker has.
  On workers with only pyspark, pyarrow and orjson, executors import `EXECUTOR_MODULES`
  alone, none of which imports faust, aiokafka, rocksdict or structlog at import time
  (tests/spark/test_imports.py keeps it so); there the service's apply must live in a module
  that imports no more (the template's domain.py, handlers included), while a one-module
  service (`Service(...)` beside apply) needs the runtime installed on the workers, as on
  local[N]. The Kafka access layer (`READER_MODULES`) is
  imported by the Python reader only; a backfill into a SQL projection's tables imports
  `SQL_MODULES` too, which need psycopg (and only that) on the workers.

Why a zip of sources and not an environment archive (venv-pack, conda-pack): these are pure
Python and weigh ~330 kB, while an environment holds the whole runtime (faust, RocksDB,
aiohttp: hundreds of MB per job) and only runs where the OS, CPU and Python match the
driver's. The native packages executors need (pyarrow, orjson) are the ones a Spark image
ships or installs once.

The Python reader also needs aiokafka. Its C extensions are optional (it falls back to pure
Python), so `reader_archive` packs its Python sources and those of its dependencies; the job
adds that zip as a plain file and `import_aiokafka` puts it at the END of sys.path only when
the worker has no aiokafka of its own, so an installed (faster) aiokafka always wins.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import stat
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from enhydra.aggregate import Aggregate

# Enhydra modules an executor may import; each is importable with pyarrow and orjson alone.
EXECUTOR_MODULES = (
    "enhydra",
    "enhydra.aggregate",
    "enhydra.windows",
    "enhydra.contracts",
    "enhydra.contracts.codec",
    "enhydra.contracts.fingerprint",
    "enhydra.contracts.fold_input",
    "enhydra.contracts.headers",
    "enhydra.contracts.names",
    "enhydra.contracts.partitioner",
    "enhydra.evolution",
    "enhydra.messages",  # typed declarations: needs msgspec, only a typed service imports it
    "enhydra.plugins",  # extend/Handler: a domain module with generated handlers imports it
    "enhydra.projections",
    "enhydra.projections.model",
    "enhydra.snapshots",
    "enhydra.snapshots.format",
    "enhydra.spark",
    "enhydra.spark.fold",
    "enhydra.spark.partition_files",
    "enhydra.spark.ship",
    "enhydra.spark.source",
    "enhydra.spark.sink",
)
# Enhydra modules the Python reader and writer may import on executors besides those: the
# Kafka access layer and its settings (they need aiokafka, which the reader archive brings).
READER_MODULES = (
    "enhydra.settings",
    "enhydra.kafka",
    "enhydra.kafka.clients",
    "enhydra.kafka.errors",
    "enhydra.kafka.noise",
    "enhydra.kafka.reading",
    "enhydra.kafka.spark_options",
)
# Enhydra modules a backfill into a SQL projection's tables imports on executors besides the
# executor modules: the fold and the writer (they need psycopg, which such workers install).
SQL_MODULES = (
    "enhydra.sql",
    "enhydra.sql.fold",
    "enhydra.sql.model",
    "enhydra.sql.rows",
    "enhydra.sql.writer",
    "enhydra.spark.sql_sink",
)
# aiokafka and what it imports, for workers without it (pure-Python sources only)
READER_PACKAGES = ("aiokafka", "async_timeout", "packaging", "typing_extensions")
READER_ARCHIVE = "enhydra-python-reader"  # + "-<hash>.zip"
# never shipped as part of a service package: the runtime is installed, not shipped
_NOT_SERVICE = {"enhydra", "builtins", "__main__", "functools", "operator"}
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # zip entries with one timestamp: same code, same bytes


class ShipError(RuntimeError):
    """The job's code cannot be packed; the message says what is missing."""


class DriverLog:
    """A structlog logger imported on first use: modules that executors import log only on the
    driver, and executors have no structlog."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        from enhydra.logs import get_logger

        return getattr(get_logger(self._name), attr)


log = DriverLog("enhydra.spark.ship")


# --------------------------------------------------------------------------- what to pack


def _module_files(module: ModuleType) -> list[tuple[Path, str]]:
    """(file, name in the zip) of a module or a whole package, sources and data, no caches."""
    name = module.__name__
    paths = list(getattr(module, "__path__", []) or [])
    if not paths:
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py"):
            raise ShipError(f"module {name!r} has no Python source file to ship ({file})")
        return [(Path(file), Path(file).name)]
    files = []
    for root in paths:
        root = Path(root)
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
                files.append((path, "/".join((*name.split("."), *rel.parts))))
    return files


def _components(fn: Any) -> Iterable[Any]:
    """fn and, for an extended aggregate's dispatcher (plugins.py), every function it routes to;
    a wrapper (functools.wraps) also yields what it wraps."""
    yield fn
    parts = getattr(fn, "parts", None)
    if callable(parts):
        for _, part in parts():
            yield from _components(part)
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None:
        yield from _components(wrapped)


def service_packages(aggregate: Aggregate, also: Iterable[Any] = ()) -> list[str]:
    """Top-level packages the aggregate's functions come from (what executors unpickle), and
    those of the functions `also` names (a SQL projection's `project`, wherever it lives)."""
    found = []
    functions = (
        aggregate.apply,
        aggregate.decide,
        aggregate.parse,
        *aggregate.upcasters.values(),
        *also,
    )
    for fn in (part for top in functions for part in _components(top)):
        module = getattr(fn, "__module__", None)
        if not module:
            continue
        top = module.split(".")[0]
        if top in _NOT_SERVICE or top in sys.stdlib_module_names or top in found:
            continue
        found.append(top)
    return found


def _enhydra_files() -> list[tuple[Path, str]]:
    """Every file of the enhydra package: never a part of it (see the module's docstring)."""
    import enhydra

    return _module_files(enhydra)


def _zip(entries: Iterable[tuple[Path, str]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        seen = set()
        for path, name in sorted(entries, key=lambda e: e[1]):
            if name in seen:
                continue
            seen.add(name)
            info = zipfile.ZipInfo(name, _FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


def _private_dir(directory: Path) -> Path:
    """`directory`, made if missing, once it is certainly ours alone.

    It sits in the shared temp folder under a name anyone can guess: another user could make
    it first (or a symlink to their folder) and swap the code our executors import.
    """
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory.lstat()  # lstat: a symlink is judged itself, not where it points
    problem = None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        problem = "is not a plain directory (a symlink?)"
    elif info.st_uid != os.getuid():
        problem = f"belongs to another user (uid {info.st_uid})"
    elif info.st_mode & 0o022:
        problem = f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    if problem is not None:
        raise ShipError(f"{directory} {problem}; remove it or point TMPDIR at a private folder")
    return directory


def _write(data: bytes, stem: str) -> Path:
    """Write under a name that carries the content's hash: Spark refuses a second file with
    the same name, and the same code shipped twice is one file."""
    digest = hashlib.sha256(data).hexdigest()[:12]
    directory = _private_dir(Path(tempfile.gettempdir()) / f"enhydra-ship-{os.getuid()}")
    path = directory / f"{stem}-{digest}.zip"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(data)
        os.replace(partial, path)
    return path


def job_archive(aggregate: Aggregate, also: Iterable[Any] = ()) -> tuple[Path, list[str]]:
    """The zip executors import the job from, and the service packages in it."""
    packages = service_packages(aggregate, also)
    entries = _enhydra_files()
    for name in packages:
        entries += _module_files(sys.modules[name])
    return _write(_zip(entries), "enhydra-job"), packages


def reader_archive() -> Path:
    """aiokafka and its pure-Python dependencies, for the Python reader on bare workers."""
    entries: list[tuple[Path, str]] = []
    for name in READER_PACKAGES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ShipError(
                f"the Python reader ships {name}, which the driver lacks: {exc}"
            ) from exc
        entries += [
            (path, arc)
            for path, arc in _module_files(module)
            if path.suffix in (".py", ".typed", ".pyi") or path.name == "py.typed"
        ]
    return _write(_zip(entries), READER_ARCHIVE)


def ship(
    spark: Any, aggregate: Aggregate, *, python_reader: bool, also: Iterable[Any] = ()
) -> list[str]:
    """Add the job's code to the SparkContext (before any plan that runs it is built).

    Returns the service packages shipped. `python_reader` also sends aiokafka along; `also`:
    more functions the executors run (their packages are shipped too).
    """
    sc = spark.sparkContext
    path, packages = job_archive(aggregate, also)
    sc.addPyFile(str(path))
    size = path.stat().st_size
    if python_reader:
        reader = reader_archive()
        sc.addFile(str(reader))
        size += reader.stat().st_size
    log.info("job code shipped to executors", packages=packages, kib=round(size / 1024))
    return packages


# --------------------------------------------------------------------------- on executors


def import_aiokafka() -> None:
    """Make `import aiokafka` work on a worker: its own if it has one, else the shipped copy."""
    try:
        import aiokafka
    except ImportError as exc:
        from pyspark import SparkFiles

        shipped = next(Path(SparkFiles.getRootDirectory()).glob(f"{READER_ARCHIVE}-*.zip"), None)
        if shipped is None:
            raise ImportError(
                f"the Python Kafka reader needs aiokafka on the Spark workers ({exc}); install "
                "it there, or run the job with `enhydra backfill`, which ships it"
            ) from exc
        if str(shipped) not in sys.path:
            sys.path.append(str(shipped))
        importlib.invalidate_caches()
        import aiokafka  # noqa: F401
