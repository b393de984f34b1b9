"""`enhydra generate handler|projection|reaction|saga|job NAME`: grow a service, with tests.

Renders a template from `generators/<kind>/` into the service found from the current
directory (its pyproject.toml names the package), then wires the piece in where the service
will pick it up: a registry module per kind (`PKG/handlers/__init__.py` with HANDLERS,
`PKG/projections/__init__.py` with PROJECTIONS, `PKG/reactions/__init__.py` with REACTIONS,
`PKG/sagas/__init__.py` with SAGAS)
that this command rewrites, plus a short block
appended once to `PKG/domain.py` or `PKG/service.py`. Existing files are never overwritten.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import keyword
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from enhydra.cli.extras import require_dev_tools
from enhydra.scaffold import scaffold_root, service_template

NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")


class GenerateError(click.ClickException):
    """The project or the name does not allow generating; the message says what to change."""


@dataclass(frozen=True)
class Project:
    root: Path
    package: str

    @property
    def package_dir(self) -> Path:
        return self.root / self.package


def find_project(start: Path) -> Project:
    """The generated service containing `start`: pyproject.toml plus PKG/service.py."""
    for folder in [start, *start.parents]:
        pyproject = folder / "pyproject.toml"
        if not pyproject.is_file():
            continue
        try:
            data = tomllib.loads(pyproject.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise GenerateError(f"{pyproject}: not valid TOML: {exc}") from None
        wheel = data.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {})
        packages = wheel.get("wheel", {}).get("packages") or []
        name = str(data.get("project", {}).get("name", "")).replace("-", "_")
        package = packages[0] if packages else name
        # a package, not a path: this repository's own `runtime/enhydra` is no service project
        if not package.isidentifier() or not (folder / package / "service.py").is_file():
            raise GenerateError(
                f"{folder} is not an Enhydra service: no {package or '<package>'}/service.py "
                "(run this inside a project made by `enhydra new`)"
            )
        return Project(folder, package)
    raise GenerateError(f"no pyproject.toml in {start} or above: run inside a service project")


def check_name(name: str) -> str:
    if not NAME.match(name) or keyword.iskeyword(name):
        raise GenerateError(
            f"name {name!r}: use lowercase letters, digits and '_', starting with a letter "
            "(it becomes a module name), e.g. restock or daily_totals"
        )
    return name


@functools.cache
def _filters() -> Any:
    """The template's own filters (template/enhydra_filters.py): a handler names its classes
    and its event (past tense: renew -> renewed) as the template names the domain's."""
    path = service_template() / "enhydra_filters.py"
    spec = importlib.util.spec_from_file_location("enhydra_filters", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _class_name(name: str) -> str:
    return _filters().class_name(name)


def render(kind: str, project: Project, name: str, **extra: Any) -> list[Path]:
    """Render generators/<kind>/ into the project; refuse to overwrite anything."""
    from jinja2 import Environment, StrictUndefined

    source = scaffold_root() / "generators" / kind
    env = Environment(undefined=StrictUndefined, keep_trailing_newline=True)
    env.filters["class_name"] = _class_name
    context = {"package": project.package, "name": name, **extra}
    planned: list[tuple[Path, str]] = []
    for template in sorted(p for p in source.rglob("*") if p.is_file()):
        if "__pycache__" in template.parts:
            continue
        relative = env.from_string(template.relative_to(source).as_posix()).render(context)
        target = project.root / relative
        if target.exists():
            raise GenerateError(f"{target} already exists: choose another name")
        planned.append((target, env.from_string(template.read_text()).render(context)))
    _check_domain_names(kind, project, [text for _, text in planned])
    for target, text in planned:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return [target for target, _ in planned]


def _module_names(path: Path) -> set[str]:
    """The names a module defines at top level (assigned, imported, def, class)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _check_domain_names(kind: str, project: Project, texts: list[str]) -> None:
    """A generator's files import the template's names from PKG/domain.py (KEY_FIELD, CREATE,
    ...): a domain rewritten without them would get modules that do not import. Say so before
    writing anything."""
    wanted: set[str] = set()
    module = f"{project.package}.domain"
    for text in texts:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                wanted.update(a.name for a in node.names)
    domain = project.package_dir / "domain.py"
    missing = sorted(wanted - _module_names(domain)) if domain.exists() else sorted(wanted)
    if missing:
        raise GenerateError(
            f"generate {kind} uses {', '.join(missing)} from {project.package}/domain.py, which "
            "does not define them (a generated service's domain.py does): define them there, "
            f"or write the {kind} by hand (docs/); nothing was written"
        )


def _assigned_call(path: Path, callee: str) -> tuple[str, ast.Call]:
    """The name bound at module level to `callee(...)` in a file (e.g. items = Aggregate(...)),
    and the call."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
        ):
            func = node.value.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called == callee:
                return node.targets[0].id, node.value
    raise GenerateError(f"{path}: no `NAME = {callee}(...)` at module level to wire into")


REGISTRY = '''"""{doc}"""

{imports}

{constant} = {names}
'''


def write_registry(project: Project, kind: str, attr: str, constant: str, doc: str) -> Path:
    """Rewrite PKG/<kind>/__init__.py listing every generated module of that kind."""
    folder = project.package_dir / kind
    init = folder / "__init__.py"
    if init.exists() and doc not in init.read_text():
        raise GenerateError(f"{init} was edited by hand; add the new module to it yourself")
    modules = sorted(
        p.stem
        for p in folder.glob("*.py")
        if p.stem != "__init__" and f"enhydra generate {attr}" in p.read_text()
    )
    imports = "\n".join(
        f"from {project.package}.{kind}.{m} import {attr} as {m}_{attr}" for m in modules
    )
    names = "[" + ", ".join(f"{m}_{attr}" for m in modules) + "]"
    if len(constant) + 3 + len(names) > 100:  # as ruff format writes a list too long for a line
        names = "[\n" + "".join(f"    {m}_{attr},\n" for m in modules) + "]"
    init.write_text(REGISTRY.format(doc=doc, imports=imports, constant=constant, names=names))
    return init


def wire_once(path: Path, marker: str, block: str) -> bool:
    """Append `block` to a module unless its marker line is already there."""
    text = path.read_text()
    if marker in text:
        return False
    path.write_text(text.rstrip("\n") + "\n\n\n" + block)
    return True


def generate_handler(project: Project, name: str) -> list[Path]:
    domain = project.package_dir / "domain.py"
    aggregate, call = _assigned_call(domain, "Aggregate")
    event = _filters().past_tense(name)
    taken = re.findall(r"""tag=["']([^"']+)["']""", domain.read_text())
    for what, type_name in (("command", name), ("event", event)):
        if type_name in taken:
            raise GenerateError(
                f"{domain.name} already declares the type {type_name!r}: a handler's {what} "
                "type must be new; choose another name"
            )
    # An aggregate that declares its types (messages.py) gets a handler that declares its own.
    keywords = {k.arg: k.value for k in call.keywords}
    typed = any(k in keywords for k in ("command_types", "event_types", "state_type"))
    state = keywords.get("state_type")
    if typed:
        if not isinstance(state, ast.Name):
            raise GenerateError(
                f"{domain.name}: {aggregate} = Aggregate(...) declares no state_type=<Struct "
                "class>, which a typed handler's decide and apply are written against"
            )
        files = render("handler_typed", project, name, event=event, state=state.id)
    else:
        files = render("handler", project, name, event=event)
    files.append(
        write_registry(
            project,
            "handlers",
            "handler",
            "HANDLERS",
            "Command handlers added by `enhydra generate handler` (one module each).",
        )
    )
    marker = f"from {project.package}.handlers import HANDLERS"
    block = (
        "# Command types added by `enhydra generate handler`: one module each in "
        f"{project.package}/handlers/.\n"
        "from enhydra.plugins import extend  # noqa: E402\n\n"
        f"{marker}  # noqa: E402\n\n"
        f"{aggregate} = extend({aggregate}, *HANDLERS)\n"
    )
    if wire_once(domain, marker, block):
        files.append(domain)
    return files


def generate_projection(project: Project, name: str, sql: bool = False) -> list[Path]:
    files = render("projection_sql" if sql else "projection", project, name)
    if sql and (pyproject := needs_postgres_extra(project)) is not None:
        files.append(pyproject)
    files.append(
        write_registry(
            project,
            "projections",
            "projection",
            "PROJECTIONS",
            "Read models added by `enhydra generate projection` (one module each).",
        )
    )
    service_py = project.package_dir / "service.py"
    service, _ = _assigned_call(service_py, "Service")
    marker = f"from {project.package}.projections import PROJECTIONS"
    block = (
        "# Read models added by `enhydra generate projection`: one module each in "
        f"{project.package}/projections/.\n"
        f"{marker}  # noqa: E402\n\n"
        f"{service}.projections.extend(PROJECTIONS)\n"
    )
    if wire_once(service_py, marker, block):
        files.append(service_py)
    return files


def needs_postgres_extra(project: Project) -> Path | None:
    """A SQL projection needs psycopg: the project's `enhydra` dependency gets the postgres
    extra (once). Returns pyproject.toml when it changed it."""
    pyproject = project.root / "pyproject.toml"
    text = pyproject.read_text()
    if "enhydra[postgres]" in text:
        return None
    changed = re.sub(r'"enhydra(\s*@|\s*[<>=~]|")', r'"enhydra[postgres]\1', text, count=1)
    if changed == text:
        raise GenerateError(
            f"{pyproject}: no `enhydra` dependency found; add `enhydra[postgres]` to it yourself"
        )
    pyproject.write_text(changed)
    return pyproject


def generate_reaction(project: Project, name: str, source: str) -> list[Path]:
    files = render("reaction", project, name, source=source)
    files.append(
        write_registry(
            project,
            "reactions",
            "reaction",
            "REACTIONS",
            "Reactions to other services' events added by `enhydra generate reaction`.",
        )
    )
    service_py = project.package_dir / "service.py"
    service, _ = _assigned_call(service_py, "Service")
    marker = f"from {project.package}.reactions import REACTIONS"
    block = (
        "# Reactions to other services' events added by `enhydra generate reaction`:\n"
        f"# one module each in {project.package}/reactions/.\n"
        f"{marker}  # noqa: E402\n\n"
        f"{service}.reactions.extend(REACTIONS)\n"
    )
    if wire_once(service_py, marker, block):
        files.append(service_py)
    return files


def _app_id(service_py: Path) -> str:
    """The app id the service declares: Service("<app id>", ...)'s first argument."""
    _, call = _assigned_call(service_py, "Service")
    first = call.args[0] if call.args else None
    if not isinstance(first, ast.Constant) or not isinstance(first.value, str):
        raise GenerateError(
            f"{service_py.name}: Service(...) does not name its app id as a string literal; "
            "a saga reads this service's events topic, <app id>-events"
        )
    return first.value


def generate_saga(project: Project, name: str, source: str | None = None) -> list[Path]:
    service_py = project.package_dir / "service.py"
    app_id = _app_id(service_py)
    sources = [app_id, *([source] if source and source != app_id else [])]
    files = render("saga", project, name, app_id=app_id, source=source or "", sources=sources)
    files.append(
        write_registry(
            project,
            "sagas",
            "saga",
            "SAGAS",
            "Sagas over this and other services' events added by `enhydra generate saga`.",
        )
    )
    service, _ = _assigned_call(service_py, "Service")
    marker = f"from {project.package}.sagas import SAGAS"
    block = (
        "# Sagas added by `enhydra generate saga`: one module each in "
        f"{project.package}/sagas/.\n"
        f"{marker}  # noqa: E402\n\n"
        f"{service}.sagas.extend(SAGAS)\n"
    )
    if wire_once(service_py, marker, block):
        files.append(service_py)
    return files


def generate_job(project: Project, name: str) -> list[Path]:
    return render("job", project, name)


KINDS = {
    "handler": generate_handler,
    "projection": generate_projection,
    "reaction": generate_reaction,
    "saga": generate_saga,
    "job": generate_job,
}
APP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def check_sql(kind: str, sql: bool) -> dict[str, bool]:
    """--sql asks for a projection into PostgreSQL; nothing else takes it."""
    if not sql:
        return {}
    if kind != "projection":
        raise GenerateError(f"--sql is for projections only, not for a {kind}")
    return {"sql": True}


def check_source(kind: str, source: str | None) -> dict[str, str]:
    """A reaction names the upstream service it reacts to; a saga may name one it also reads;
    nothing else takes --from."""
    if kind == "saga":
        if source is not None and not APP_ID.match(source):
            raise GenerateError(
                f"--from {source!r}: an app id is letters, digits, '.', '_' or '-' (its events "
                "topic is <app id>-events)"
            )
        return {"source": source} if source is not None else {}
    if kind != "reaction":
        if source is not None:
            raise GenerateError(f"--from is for reactions and sagas only, not for a {kind}")
        return {}
    if source is None:
        raise GenerateError(
            "a reaction reacts to another service's events: name its app id with --from APP, "
            "e.g. enhydra generate reaction reserve_stock --from orders"
        )
    if not APP_ID.match(source):
        raise GenerateError(
            f"--from {source!r}: an app id is letters, digits, '.', '_' or '-' (its events "
            "topic is <app id>-events)"
        )
    return {"source": source}


@click.command()
@click.argument("kind", type=click.Choice(sorted(KINDS)))
@click.argument("name")
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=Path("."),
    help="The service project (default: the current directory or one above it).",
)
@click.option(
    "--from",
    "source",
    metavar="APP",
    help="For a reaction: the app id of the service whose events it reacts to; for a saga: "
    "another service whose events it reads besides this one's.",
)
@click.option(
    "--sql",
    is_flag=True,
    help="For a projection: rows in PostgreSQL tables (DDL, a test against a real database).",
)
def generate(kind: str, name: str, project: Path, source: str | None, sql: bool) -> None:
    """Add a handler, projection, reaction, saga or job NAME (with tests) to a generated service.

    A reaction turns the events of the service APP (--from) into commands of this one. A saga
    keeps state per correlation id over this service's events (and APP's, with --from) and
    sends commands when its deadlines fire. A projection with --sql writes rows into PostgreSQL
    tables (enhydra[postgres]).

    \b
    Examples:
      enhydra generate handler restock
      enhydra generate projection daily_totals --project ~/src/billing
      enhydra generate projection balances --sql
      enhydra generate reaction reserve_stock --from orders
      enhydra generate saga unpaid_orders --from payments
    """
    require_dev_tools("generate")
    extra: dict[str, Any] = {**check_source(kind, source), **check_sql(kind, sql)}
    found = find_project(project.resolve())
    for path in KINDS[kind](found, check_name(name), **extra):
        click.echo(f"wrote {path.relative_to(found.root)}")
    if kind != "job" and (found.root / ASYNCAPI_FILE).exists():
        refresh_asyncapi(found.root)


ASYNCAPI_FILE = "asyncapi.json"


def refresh_asyncapi(root: Path) -> None:
    """Rewrite the project's asyncapi.json: a handler or projection changes the contract, and
    the project's test holds the committed document to the code. Run in a fresh interpreter,
    so it sees the code just written; with the code's defaults, as that test does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENHYDRA_")}
    command = [sys.executable, "-m", "enhydra.cli.main", "asyncapi", "-o", ASYNCAPI_FILE]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        click.echo(f"rewrote {ASYNCAPI_FILE} (the topics' contract changed: review it)")
    else:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        hint = f"run `enhydra asyncapi -o {ASYNCAPI_FILE}`"
        click.echo(f"could not rewrite {ASYNCAPI_FILE}: {last}; {hint}", err=True)
