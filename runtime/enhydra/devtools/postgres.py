"""A local PostgreSQL from Debian's server programs: the tests' (enhydra.testing.sql) and the
one `make run` starts for a service with a SQL projection (`enhydra postgres start`).

The dev server keeps its data in the cache (`$ENHYDRA_POSTGRES_DIR`, else
`~/.cache/enhydra/postgres`), its password in a file beside it, and is reused while it runs:
`start` never starts a second server on a data dir whose server is up. initdb and pg_ctl run
as the `postgres` user when the caller is root (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from enhydra.devtools.ports import free_port, port_free
from enhydra.toolcache import cache_root

DEFAULT_PORT = 5432
DATABASE = "postgres"


class PostgresError(RuntimeError):
    """The dev server cannot start or stop; the message says why and what to do."""


PASSWORD = "enhydra-test-password"


def find_server_bin(install: bool = True) -> Path:
    """The folder of Debian's PostgreSQL server programs, installed first when missing (root)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    if os.geteuid() != 0 or not install:
        raise RuntimeError(
            "PostgreSQL is missing and only root can install it: apt-get install postgresql"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"],
        check=True,
        env=env,
        timeout=900,
    )
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    assert found, "apt-get installed postgresql but initdb is not in /usr/lib/postgresql"
    return Path(found[-1]).parent


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class Postgres:
    """One server in a folder (a temp one in tests, the cache in dev); stop() and start()
    simulate an outage."""

    def __init__(
        self,
        bin_dir: Path,
        root: Path,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.bin = bin_dir
        self.root = root
        self.data = root / "data"
        try:
            self.port = port or free_port(owner=str(root))
        except OSError as exc:
            raise PostgresError(str(exc)) from None
        self.password_file = root / "password"
        self.settings = dict(settings or {})  # more server settings (-c name=value): TLS

    def init(self, password: str = PASSWORD) -> None:
        pwfile = self.root / "initpw"
        pwfile.write_text(password)
        self.password_file.write_text(password + "\n")
        self.password_file.chmod(0o600)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(pwfile, "postgres")
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "enhydra",
                    f"--pwfile={pwfile}",
                    "-A",
                    "scram-sha-256",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        pwfile.unlink()

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=60"
        )
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-o",
                    options,
                    "-l",
                    str(self.root / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=90,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            _as_postgres(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]
            ),
            check=False,
            capture_output=True,
            timeout=90,
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://enhydra@127.0.0.1:{self.port}/{database}"


def default_data_dir() -> Path:
    """Where the dev server keeps its data: $ENHYDRA_POSTGRES_DIR, else the cache.

    As root the server runs as the postgres user, who cannot enter root's home (and so its
    cache): then /var/tmp, which every user may enter and which survives a reboot.
    """
    explicit = os.environ.get("ENHYDRA_POSTGRES_DIR")
    if explicit:
        return Path(explicit).expanduser()
    if os.geteuid() == 0:
        return Path("/var/tmp/enhydra-postgres")
    return cache_root() / "postgres"


@dataclass(frozen=True)
class Running:
    """A dev server that answers: what a service needs to reach it."""

    pid: int
    port: int
    root: Path

    @property
    def url(self) -> str:
        return f"postgresql://enhydra@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def password_file(self) -> Path:
        return self.root / "password"

    def settings(self) -> dict[str, str]:
        return {
            "ENHYDRA_DATABASE_URL": self.url,
            "ENHYDRA_DATABASE_PASSWORD_FILE": str(self.password_file),
        }


def running(root: Path) -> Running | None:
    """The server of this data dir, when its postmaster.pid names a live process."""
    try:
        lines = (root / "data" / "postmaster.pid").read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's (the postgres user's, when we are root)
        pass
    return Running(pid, port, root)


def _reachable(root: Path) -> None:
    """As root the server runs as `postgres`, which must reach the data dir: say so plainly."""
    if os.geteuid() != 0:
        return
    for folder in [root, *root.parents]:
        if folder.exists() and not os.stat(folder).st_mode & 0o001:
            raise PostgresError(
                f"{folder} is closed to the postgres user the server runs as (running as root); "
                "set ENHYDRA_POSTGRES_DIR (or --data-dir) to a folder it can reach, e.g. "
                "/var/tmp/enhydra-postgres"
            )


def start(root: Path | None = None, port: int | None = None) -> tuple[Running, bool]:
    """Start the dev server of `root` (created at first use), or find it running: never a second
    one. Returns it and whether this call started it. `port` applies to a server not running;
    None: the port it used last, else 5432 when free, else a free one."""
    root = (root or default_data_dir()).absolute()
    found = running(root)
    if found is not None:
        if port and port != found.port:
            raise PostgresError(
                f"the PostgreSQL of {root} already runs on port {found.port}, not {port}: "
                "stop it first (enhydra postgres stop) or drop --port"
            )
        return found, False
    try:
        bin_dir = find_server_bin(install=False)
    except RuntimeError as exc:
        raise PostgresError(f"{exc} (Debian, Ubuntu), then run this again") from None
    root.mkdir(parents=True, exist_ok=True)
    _reachable(root)
    last = root / "port"
    if not port:
        previous = int(last.read_text()) if last.is_file() else None
        port = previous or (DEFAULT_PORT if port_free(DEFAULT_PORT) else None)
    if port and not port_free(port):
        raise PostgresError(
            f"port {port} is taken by another program: give another one (--port, or "
            "POSTGRES_PORT=n for make run)"
        )
    server = Postgres(bin_dir, root, port)
    root.chmod(0o755)
    try:
        if not (server.data / "PG_VERSION").is_file():
            server.init(secrets.token_urlsafe(18))
        server.start()
    except subprocess.CalledProcessError as exc:
        raise PostgresError(
            f"PostgreSQL did not start: {_first_line(exc.stderr)} (log: {root / 'server.log'})"
        ) from None
    last.write_text(str(server.port))
    found = running(root)
    if found is None:
        raise PostgresError(f"PostgreSQL started but left no pid (log: {root / 'server.log'})")
    return found, True


def stop(root: Path | None = None) -> Running | None:
    """Stop the dev server of `root` (its data is kept); None when none was running."""
    root = (root or default_data_dir()).absolute()
    found = running(root)
    if found is None:
        return None
    Postgres(find_server_bin(install=False), root, found.port).stop("fast")
    return found


def _first_line(stderr: bytes | str | None) -> str:
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr or ""
    return (text.strip().splitlines() or ["no message"])[-1]


@contextlib.contextmanager
def temporary_server(prefix: str = "enhydra-pg-") -> Iterator[Postgres]:
    """A server of Debian's programs in a new temporary folder, stopped and removed after:
    the tests' session server and the benchmarks' (fsync off: they kill processes, not
    machines)."""
    bin_dir = find_server_bin()
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)  # initdb runs as the postgres user when this runs as root
    server = Postgres(bin_dir, root)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
