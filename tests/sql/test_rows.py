"""The pure parts of SQL projections: declarations, one batch's rows as statements, settings."""

from __future__ import annotations

import pytest

from enhydra.sql import Delete, SqlProjection, Table, Upsert
from enhydra.sql.config import DatabaseConfigError, DatabaseSettings, redact
from enhydra.sql.rows import plan

ACCOUNTS = Table("accounts", ("id",), "CREATE TABLE {table} (id text PRIMARY KEY, n bigint)")
TABLES = {"accounts": ACCOUNTS}


def test_rows_of_one_key_collapse_to_one_change_in_order() -> None:
    ops = [
        Upsert("accounts", {"id": "a", "n": 5}, add=("n",)),
        Upsert("accounts", {"id": "a", "n": 2}, add=("n",)),
        Upsert("accounts", {"id": "b", "n": 1}),
        Delete("accounts", {"id": "b"}),
        Delete("accounts", {"id": "c"}),
        Upsert("accounts", {"id": "c", "n": 3}, add=("n",)),
    ]
    result = plan(ops, TABLES)
    assert sorted(result.deletes["accounts"]) == [("b",), ("c",)]
    # a: two additions sum to one relative row; c: inserted after its delete
    assert result.upserts == {("accounts", ("id", "n"), ("n",)): [("a", 7), ("c", 3)]}


def test_an_absolute_value_then_an_addition_stays_absolute() -> None:
    ops = [
        Upsert("accounts", {"id": "a", "n": 10}),
        Upsert("accounts", {"id": "a", "n": 1}, add=("n",)),
    ]
    assert plan(ops, TABLES).upserts == {("accounts", ("id", "n"), ()): [("a", 11)]}


def test_ops_on_tables_or_keys_the_projection_lacks_are_refused() -> None:
    projection = SqlProjection("p", lambda k, e: [], (ACCOUNTS,))
    with pytest.raises(ValueError, match="does not declare"):
        projection.check([Upsert("other", {"id": "a"})])
    with pytest.raises(ValueError, match="lacks its key"):
        projection.check([Upsert("accounts", {"n": 1})])
    with pytest.raises(ValueError, match="add= names id"):
        projection.check([Upsert("accounts", {"id": "a"}, add=("id",))])
    with pytest.raises(ValueError, match="lower-case"):
        projection.check([Upsert("accounts", {"id": "a", 'n"; drop': 1})])


def test_declarations_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="CREATE TABLE"):
        Table("t", ("id",), "CREATE TABLE t (id text)")
    with pytest.raises(ValueError, match="key columns"):
        Table("t", (), "CREATE TABLE {table} (id text)")
    with pytest.raises(ValueError, match="declare the tables"):
        SqlProjection("p", lambda k, e: [], ())


def test_database_settings_never_show_the_password(tmp_path) -> None:
    url = "postgresql://app:s3cret@db:5432/reads"
    assert redact(url) == "postgresql://app:***@db:5432/reads"
    in_query = "postgresql://db/reads?sslmode=require&password=s3cret&sslpassword=k3y&user=app"
    assert redact(in_query) == (
        "postgresql://db/reads?sslmode=require&password=***&sslpassword=***&user=app"
    )
    assert "s3cret" not in repr(DatabaseSettings(in_query))
    assert (
        redact("postgresql://app:s3cret@db/r?PASSWORD=x")
        == "postgresql://app:***@db/r?PASSWORD=***"
    )
    assert "s3cret" not in repr(DatabaseSettings(url))
    # libpq's split, not a web URL's: a `#` or `?` in the password, a `#` in a query value
    assert redact("postgresql://app:pa#s?s@db/r") == "postgresql://app:***@db/r"
    assert redact("postgresql://db/r?password=ab#cd&x=1") == "postgresql://db/r?password=***&x=1"
    assert (
        redact("postgresql://app@db/r?sslmode=require") == "postgresql://app@db/r?sslmode=require"
    )
    encoded = "postgresql://db/r?pass%77ord=s3cret&ssl%70assword=k3y&passwords=kept"
    assert redact(encoded) == "postgresql://db/r?pass%77ord=***&ssl%70assword=***&passwords=kept"
    with pytest.raises(DatabaseConfigError, match="ENHYDRA_DATABASE_URL is not set"):
        DatabaseSettings.from_env({})
    with pytest.raises(DatabaseConfigError, match="not a readable file"):
        DatabaseSettings.from_env(
            {"ENHYDRA_DATABASE_URL": url, "ENHYDRA_DATABASE_PASSWORD_FILE": str(tmp_path / "x")}
        )
    with pytest.raises(DatabaseConfigError, match="expected postgresql://"):
        DatabaseSettings("mysql://app:s3cret@db/x")


def test_the_host_runs_a_sql_projection_on_its_own_engine(monkeypatch, tmp_path) -> None:
    from enhydra.projections.host import engine_for
    from enhydra.settings import Settings
    from enhydra.sql.engine import SqlProjectionEngine

    monkeypatch.setenv("ENHYDRA_DATABASE_URL", "postgresql://app:s3cret@db:5432/reads")
    settings = Settings.from_env({"ENHYDRA_APP_ID": "a", "ENHYDRA_STATE_DIR": str(tmp_path)})
    projection = SqlProjection("balances", lambda k, e: [], (ACCOUNTS,))
    engine = engine_for(settings, projection, "a-events")
    assert isinstance(engine, SqlProjectionEngine)
    described = engine.describe()
    assert described["kind"] == "sql" and described["waiting"] is None
    assert described["database"] == "postgresql://app:***@db:5432/reads"


def test_the_live_topology_check_knows_a_sql_projections_topics_without_a_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`enhydra topology check --live` checks the topics a start creates: a SQL projection's
    dead letters among them (history kept), with no ENHYDRA_DATABASE_URL where it runs."""
    from enhydra.runtime import topic_specs
    from tests.sql.accounts import SERVICE

    monkeypatch.delenv("ENHYDRA_DATABASE_URL", raising=False)
    resolved = SERVICE.resolved()  # its settings as this process has them (another test's too)
    settings = resolved.settings
    specs = {spec.name: spec for spec in topic_specs(resolved)}
    assert specs[settings.dlq_topic].history
    assert specs[f"{settings.app_id}-accounts-changelog"].compacted


def test_the_pool_and_connect_timeout_come_from_the_environment_or_fail_naming_the_setting():
    url = "postgresql://app@db:5432/reads"
    default = DatabaseSettings.from_env({"ENHYDRA_DATABASE_URL": url})
    assert (default.pool_min, default.pool_max, default.connect_timeout_s) == (1, 4, 5.0)
    env = {
        "ENHYDRA_DATABASE_URL": url,
        "ENHYDRA_DATABASE_POOL_MAX": "2",
        "ENHYDRA_DATABASE_CONNECT_TIMEOUT_S": "2.5",
    }
    settings = DatabaseSettings.from_env(env)
    assert (settings.pool_min, settings.pool_max, settings.connect_timeout_s) == (1, 2, 2.5)
    for name, value, reason in [
        ("ENHYDRA_DATABASE_POOL_MAX", "four", "whole number"),
        ("ENHYDRA_DATABASE_POOL_MAX", "0", "1 to 100"),
        ("ENHYDRA_DATABASE_CONNECT_TIMEOUT_S", "1", "2 to 600 seconds"),
        ("ENHYDRA_DATABASE_CONNECT_TIMEOUT_S", "soon", "2-600 seconds"),
    ]:
        with pytest.raises(DatabaseConfigError, match=f"^{name}=.*{reason}"):
            DatabaseSettings.from_env({**env, name: value})
