"""The `enhydra` command as a user meets it: one convention, help with examples, plain answers.

Every case here stops before Kafka or a service would be needed: that is the point of them
(arguments are checked first; empty and wrong states get one line and an exit code).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from enhydra.cli.common import StatusLine
from enhydra.cli.main import main
from enhydra.contracts.codec import Entry, encode_entry
from enhydra.snapshots import Cut, SnapshotWriter
from enhydra.testing.processes import free_port


def commands(
    group: click.Group = main, path: str = "enhydra"
) -> Iterator[tuple[str, click.Command]]:
    yield path, group
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # sub-commands load lazily (cli/main.py)
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            yield from commands(command, f"{path} {name}")
        else:
            yield f"{path} {name}", command


ALL = list(commands())


def help_of(path: str) -> str:
    result = CliRunner().invoke(main, [*path.split()[1:], "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("path", [p for p, _ in ALL])
def test_every_command_and_group_shows_an_example(path: str) -> None:
    text = help_of(path)
    assert "Example:" in text or "Examples:" in text, text
    example = text.split("Example", 1)[1]
    assert "enhydra " in example, f"{path}: the example should show the command in use"


def test_run_does_not_load_what_only_other_commands_need() -> None:
    """A running service's memory: `enhydra run` imports neither pyarrow nor cookiecutter."""
    import subprocess
    import sys

    code = (
        "import sys; from enhydra.cli.main import main; "
        "main(['run', '--help'], standalone_mode=False); "
        "heavy = ('pyarrow', 'numpy', 'cookiecutter', 'pyspark'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_the_walk_found_the_whole_tree() -> None:
    paths = {p for p, _ in ALL}
    assert {"enhydra", "enhydra run", "enhydra snapshot list", "enhydra image build"} <= paths
    assert len(paths) > 30


@pytest.mark.parametrize("path,command", ALL, ids=[p for p, _ in ALL])
def test_options_show_their_variable_and_use_the_shared_names(
    path: str, command: click.Command
) -> None:
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        if param.envvar:
            assert param.show_envvar, f"{path} {param.opts}: shows no env var in --help"
        assert "--app-id" not in param.opts, f"{path}: the application id is --app"
        if param.name == "app_id":
            assert param.opts == ["--app"] and param.envvar == "ENHYDRA_APP_ID", path
        if "--bootstrap" in param.opts:
            assert param.envvar == "ENHYDRA_BOOTSTRAP_SERVERS", path
    for param in command.params:
        if isinstance(param, click.Argument) and param.name in ("service", "module"):
            raise AssertionError(f"{path}: the service is the TARGET argument")


def test_the_service_is_a_positional_target_wherever_a_command_takes_one() -> None:
    takes_target = {
        p
        for p, c in ALL
        if any(x.name == "target" for x in c.params if isinstance(x, click.Argument))
    }
    assert takes_target >= {
        "enhydra run",
        "enhydra snapshot verify",
        "enhydra snapshot clone",
        "enhydra snapshot restore",
        "enhydra snapshot at",
        "enhydra topology show",
        "enhydra topology check",
        "enhydra topology lock",
        "enhydra asyncapi",
    }


# --------------------------------------------------------------------------- enhydra asyncapi


def test_asyncapi_outside_a_project_asks_for_the_target(tmp_path: Path) -> None:
    result = enhydra("asyncapi", cwd=tmp_path)
    assert result.exit_code == 1
    line = one_error(result)
    assert "no pyproject.toml" in line and "enhydra asyncapi MODULE:ATTR" in line


def test_asyncapi_says_which_baseline_file_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "topology.json"
    result = enhydra("asyncapi", "ledger.typed:service", "--baseline", str(missing))
    assert result.exit_code == 1
    assert str(missing) in one_error(result)


def test_asyncapi_names_a_bad_setting_and_exits_2() -> None:
    result = enhydra("asyncapi", "ledger.service:service", env={"ENHYDRA_PARTITIONS": "abc"})
    assert result.exit_code == 2
    assert "ENHYDRA_PARTITIONS='abc'" in one_error(result)


def test_asyncapi_documents_the_servers_given_with_bootstrap() -> None:
    result = enhydra("asyncapi", "ledger.service:service", "--bootstrap", "k1.prod:9092")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["servers"]["kafka"]["host"] == "k1.prod:9092"


# --------------------------------------------------------------------------- enhydra run


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env=env)


@dataclasses.dataclass
class Ran:
    exit_code: int
    output: str


def enhydra(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Ran:
    """The command in its own process: `run` writes its flags into its environment."""
    done = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", *args],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return Ran(done.returncode, done.stdout + done.stderr)


def one_error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_run_refuses_a_target_that_does_not_import() -> None:
    result = enhydra("run", "nowhere.service:service")
    assert result.exit_code == 2
    assert "cannot import 'nowhere.service'" in one_error(result)
    result = enhydra("run", "ledger")
    assert result.exit_code == 2
    assert "expected MODULE:ATTR" in one_error(result)
    result = enhydra("run", "ledger.domain:parse")
    assert result.exit_code == 2
    assert "is function, not an enhydra.Service" in one_error(result)


@pytest.mark.parametrize(
    "flag,value,expected",
    [
        ("--web-port", "99999", "a TCP port between 0 and 65535"),
        ("--log-level", "loud", "one of debug, info, warning, error"),
        ("--log-format", "xml", "one of auto, json, console"),
        ("--app", "no spaces", "a Kafka group/topic name"),
    ],
)
def test_run_checks_its_flags_with_the_settings_rules(flag: str, value: str, expected: str):
    result = enhydra("run", "ledger.service:service", flag, value)
    assert result.exit_code == 2
    error = one_error(result)
    assert flag in error and expected in error


def test_run_names_the_variable_behind_a_bad_flag_value_from_the_environment() -> None:
    result = enhydra("run", "ledger.service:service", env={"ENHYDRA_WEB_PORT": "web"})
    assert result.exit_code == 2
    assert "'--web-port' (env var: 'ENHYDRA_WEB_PORT')" in one_error(result)


def test_run_refuses_a_state_dir_it_cannot_create(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = enhydra("run", "ledger.service:service", "--state-dir", str(blocker / "state"))
    assert result.exit_code == 2
    assert f"{blocker / 'state'}: cannot create or write it" in one_error(result)


def test_run_refuses_other_bad_settings_before_starting() -> None:
    result = enhydra("run", "ledger.service:service", env={"ENHYDRA_PARTITIONS": "many"})
    assert result.exit_code == 2
    assert "ENHYDRA_PARTITIONS='many' is invalid: expected a whole number" in one_error(result)


# --------------------------------------------------------------------------- snapshots


def a_snapshot(directory: Path) -> Path:
    writer = SnapshotWriter(
        directory, app_id="bank", store="accounts", fingerprint="f" * 16, source="live"
    )
    value = encode_entry(Entry({"balance": 7}, offset=3, command_ids=["c3"]))
    writer.write_partition(0, [(b"acct-1", value)])
    writer.finish(Cut("bank-commands", {0: 4}), partitions=1)
    return directory


def test_snapshot_list_says_when_the_storage_does_not_exist(tmp_path: Path) -> None:
    result = invoke("snapshot", "list", "--storage", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert f"{tmp_path / 'nowhere'}: no such folder" in one_error(result)


def test_snapshot_list_says_when_there_are_no_snapshots(tmp_path: Path) -> None:
    (tmp_path / "unfinished").mkdir()  # no manifest: not a snapshot
    result = invoke("snapshot", "list", "--storage", str(tmp_path))
    assert result.exit_code == 1
    assert (
        result.output
        == f"no snapshots in file://{tmp_path} (take one with `enhydra snapshot create`)\n"
    )


def test_snapshot_list_prints_the_ids(tmp_path: Path) -> None:
    a_snapshot(tmp_path / "bank-1")
    a_snapshot(tmp_path / "bank-2")
    result = invoke("snapshot", "list", "--storage", f"file://{tmp_path}")
    assert result.exit_code == 0
    assert result.output == "bank-1\nbank-2\n"


def test_snapshot_list_reads_the_storage_from_the_environment(tmp_path: Path) -> None:
    a_snapshot(tmp_path / "bank-1")
    result = invoke("snapshot", "list", env={"ENHYDRA_SNAPSHOT_STORAGE": str(tmp_path)})
    assert result.output == "bank-1\n"


def test_snapshot_query_says_which_store_or_key_is_unknown(tmp_path: Path) -> None:
    snap = str(a_snapshot(tmp_path / "bank-1"))
    found = invoke("snapshot", "query", snap, "accounts", "acct-1")
    assert found.exit_code == 0 and json.loads(found.output) == {"balance": 7}
    store = invoke("snapshot", "query", snap, "ledgers", "acct-1")
    assert store.exit_code == 1
    assert "no store 'ledgers' in this snapshot (it holds 'accounts')" in one_error(store)
    key = invoke("snapshot", "query", snap, "accounts", "acct-9")
    assert key.exit_code == 1
    assert "no key 'acct-9' in accounts" in one_error(key)


def test_snapshot_commands_refuse_a_snapshot_that_does_not_exist(tmp_path: Path) -> None:
    result = invoke("snapshot", "verify", str(tmp_path / "gone"))
    assert result.exit_code == 2
    assert "no such folder" in one_error(result)
    remote = invoke("snapshot", "verify", f"{tmp_path / 'gone'}#bank-1")
    assert remote.exit_code == 2
    assert "no such folder" in one_error(remote)


def test_snapshot_commands_check_the_target_before_kafka(tmp_path: Path) -> None:
    snap = str(a_snapshot(tmp_path / "bank-1"))
    dead = f"127.0.0.1:{free_port()}"
    result = invoke(
        "snapshot", "clone", snap, "nowhere:service", "--to-app", "x", "--bootstrap", dead
    )
    assert result.exit_code == 2
    assert "cannot import 'nowhere'" in one_error(result)
    result = invoke("snapshot", "at", "--time", "2026-01-01T00:00:00Z", "--output", "o")
    assert result.exit_code == 2
    assert "Missing argument 'TARGET'" in one_error(result)


def test_snapshot_create_refuses_an_unknown_storage_before_kafka() -> None:
    dead = f"127.0.0.1:{free_port()}"
    result = invoke(
        "snapshot", "create", "--app", "bank", "--storage", "ftp://x", "--bootstrap", dead
    )
    assert result.exit_code == 2  # 3 would mean it went to Kafka first
    assert "unsupported snapshot storage 'ftp://x'" in one_error(result)


def test_the_old_service_option_still_works_and_says_what_to_use(tmp_path: Path) -> None:
    snap = str(a_snapshot(tmp_path / "bank-1"))
    result = invoke("snapshot", "verify", snap, "--service", "nowhere:service")
    assert "--service is deprecated: pass MODULE:ATTR as the TARGET argument" in result.output
    assert result.exit_code == 2 and "cannot import 'nowhere'" in one_error(result)
    both = invoke("snapshot", "verify", snap, "a:b", "--service", "c:d")
    assert both.exit_code == 2 and "TARGET given twice" in one_error(both)


# --------------------------------------------------------------------------- enhydra query


def test_query_fails_at_once_when_no_instance_answers() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = invoke("query", "accounts", "acct-1", "--url", url, "--retry-for", "60")
    assert result.exit_code == 3
    assert time.monotonic() - started < 60, "it waited for a service that is not there"
    assert one_error(result) == f"Error: no instance answers at {url} (connection refused)"
    assert "is the service running?" in result.output
    assert "waiting" not in result.output


def test_query_reads_the_url_from_the_environment() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = invoke("query", "accounts", "acct-1", env={"ENHYDRA_QUERY_URL": url})
    assert result.exit_code == 3 and url in one_error(result)


# --------------------------------------------------------------------------- progress lines


class Log(io.StringIO):
    def isatty(self) -> bool:
        return False


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_status_line_in_a_log_is_a_line_every_few_seconds_and_keeps_the_last_state() -> None:
    out = Log()
    line = StatusLine(out, every_s=3600)
    line.show("first", now=True)
    line.show("held back")
    line.show("latest")
    assert out.getvalue() == "first\n"
    line.flush()
    assert out.getvalue() == "first\nlatest\n"
    line.clear()
    assert out.getvalue() == "first\nlatest\n"


def test_a_status_line_on_a_terminal_is_redrawn_in_place_and_cleared() -> None:
    out = Terminal()
    line = StatusLine(out)
    line.show("one", now=True)
    line.show("two", now=True)
    line.clear()
    assert out.getvalue() == "\r\x1b[Kone\r\x1b[Ktwo\r\x1b[K"
