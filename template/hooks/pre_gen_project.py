"""Refuse input that would generate a project that cannot import, start or deploy.

Cookiecutter renders this file before generating anything, so a bad name fails here with a
message naming the variable, instead of later as a puzzling import, Kafka or Kubernetes error.
"""

from __future__ import annotations

import keyword
import re
import sys

VALUES: dict[str, str] = {
    "project_slug": {{ cookiecutter.project_slug | tojson }},
    "package_name": {{ cookiecutter.package_name | tojson }},
    "app_id": {{ cookiecutter.app_id | tojson }},
    "partitions": {{ cookiecutter.partitions | string | tojson }},
    "web_port": {{ cookiecutter.web_port | string | tojson }},
    "python_version": {{ cookiecutter.python_version | tojson }},
    "enhydra_requirement": {{ cookiecutter.enhydra_requirement | tojson }},
    "description": {{ cookiecutter.description | tojson }},
    "aggregate": {{ cookiecutter.aggregate | tojson }},
    "key_field": {{ cookiecutter.key_field | tojson }},
    "command_types": {{ cookiecutter.command_types | tojson }},
    "enhydra_source": {{ cookiecutter.enhydra_source | tojson }},
}

# A DNS-1035 label (what Kubernetes requires of Service names): the slug names the compose
# services, the image and the Kubernetes objects. 52 characters leave room for the pod suffixes
# of the StatefulSet and for "<slug>-headless".
SLUG = re.compile(r"^[a-z]([a-z0-9-]{0,50}[a-z0-9])?$")
# Kafka accepts upper case too, but group ids and topic prefixes are kept lower case so that
# names never differ only by case between environments.
APP_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
DIGITS = re.compile(r"^[0-9]{1,9}$")
PYTHON_VERSION = re.compile(r"^3\.[0-9]{1,2}$")
RESERVED_PACKAGES = {"enhydra", "tests", "test", "faust", "aiokafka"}
# Lowercase names: they become Python names, store and topic names and event types.
NAME = re.compile(r"^[a-z][a-z0-9_]{0,23}$")
# Names the generated domain.py and service.py already use for something else.
RESERVED_NAMES = {"service", "decide", "apply", "parse", "fields", "annotations"}
# Fields every command has already: the key must be another one.
ENVELOPE_FIELDS = {"command_id", "type"}
# Fields the generated command types declare besides the key.
COMMAND_FIELDS = {"name", "note"}
# The classes domain.py declares, as the template names them (enhydra_filters.class_name):
# commands, events, the state and the key's type; and the names it imports.
CLASSES: dict[str, str] = {
{%- for c in cookiecutter.command_types | command_list %}
    {{ ("command type " ~ c) | tojson }}: {{ c | class_name | tojson }},
    {{ ("event type " ~ (c | past_tense)) | tojson }}: {{ c | past_tense | class_name | tojson }},
{%- endfor %}
    "the state": {{ cookiecutter.key_field | class_name | tojson }},
    "the key's type": {{ (cookiecutter.key_field | class_name ~ "Id") | tojson }},
}
IMPORTED = {"Aggregate", "Annotated", "Any", "Command", "Event", "Rejection"}


def check_slug(value: str) -> str | None:
    if not SLUG.match(value):
        return (
            "must be 1-52 lowercase letters, digits or '-', starting with a letter and ending "
            "with a letter or digit (it names the image and the Kubernetes objects); derived from "
            "project_name unless given, e.g. project_slug=stock-keeper"
        )
    return None


def check_package(value: str) -> str | None:
    if not value.isidentifier():
        return (
            "is not a valid Python identifier: use letters, digits and '_', not starting "
            "with a digit, e.g. package_name=stock_keeper"
        )
    if keyword.iskeyword(value):
        return f"is a Python keyword and cannot be imported; try package_name={value}_service"
    if value in RESERVED_PACKAGES or value in sys.stdlib_module_names:
        return (
            f"would shadow the {value!r} module (standard library or a dependency); "
            f"try package_name={value}_service"
        )
    return None


def check_app_id(value: str) -> str | None:
    if not APP_ID.match(value) or len(value) > 200:
        return (
            "must match ^[a-z0-9][a-z0-9._-]*$ (lowercase letters, digits, '.', '_', '-'; it is "
            "the Kafka group id and topic prefix), e.g. app_id=stock-keeper"
        )
    return None


def check_partitions(value: str) -> str | None:
    if not DIGITS.match(value) or int(value) <= 0:
        return "must be a positive whole number (partitions of the commands topic), e.g. 4"
    return None


def check_web_port(value: str) -> str | None:
    if not DIGITS.match(value) or not 1 <= int(value) <= 65535:
        return "must be a TCP port between 1 and 65535, e.g. 6066"
    return None


def check_python_version(value: str) -> str | None:
    if not PYTHON_VERSION.match(value):
        return "must look like 3.11 (major.minor; it picks the base image and CI's Python)"
    return None


def check_requirement(value: str) -> str | None:
    if not re.match(r"^enhydra([^\"'\\\r\n]*)$", value):
        return "must be one requirement on enhydra, without quotes, e.g. enhydra>=0.1,<0.2"
    return None


def _name_problem(value: str, example: str) -> str | None:
    if not NAME.match(value):
        return (
            "must be a lowercase name of up to 24 letters, digits or '_' (a letter first), "
            f"e.g. {example}"
        )
    return None


def check_aggregate(value: str) -> str | None:
    if NAME.match(value) and (keyword.iskeyword(value) or value in RESERVED_NAMES):
        return f"is taken by Python or the generated code (it becomes a Python name); try my_{value}"
    return _name_problem(value, "aggregate=accounts")


def check_key_field(value: str) -> str | None:
    if value in ENVELOPE_FIELDS:
        return "is a field every command has already; name the key, e.g. key_field=account"
    if value in COMMAND_FIELDS:
        return (
            f"is a field of the generated commands ({', '.join(sorted(COMMAND_FIELDS))}); "
            f"name the key otherwise, e.g. key_field={value}_id"
        )
    if NAME.match(value) and keyword.iskeyword(value):
        return f"is a Python keyword (it becomes a field of the command classes); try {value}_id"
    return _name_problem(value, "key_field=account")


def check_command_types(value: str) -> str | None:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        return "must name at least one command type, e.g. command_types='open, deposit, close'"
    for name in names:
        problem = _name_problem(name, "command_types='open, deposit, close'")
        if problem is not None:
            return f"has {name!r}, which {problem}"
    if len(set(names)) != len(names):
        return "names a command type twice"
    return check_class_names()


def check_class_names() -> str | None:
    """Two declarations of domain.py must not get the same class name, nor an imported one."""
    seen: dict[str, str] = {}
    for what, cls in CLASSES.items():
        if cls in IMPORTED:
            return f"makes {what} a class named {cls}, a name domain.py imports; rename it"
        if cls in seen:
            return f"makes {seen[cls]} and {what} both a class named {cls}; rename one"
        seen[cls] = what
    return None


def check_source(value: str) -> str | None:
    if value not in ("vendor", "index"):
        return "must be vendor (the wheel goes into vendor/) or index (installed from an index)"
    return None


def check_description(value: str) -> str | None:
    if not value.strip() or any(c in value for c in "\r\n"):
        return "must be one non-empty line (it goes into pyproject.toml and the image label)"
    return None


CHECKS = {
    "project_slug": check_slug,
    "package_name": check_package,
    "app_id": check_app_id,
    "partitions": check_partitions,
    "web_port": check_web_port,
    "python_version": check_python_version,
    "enhydra_requirement": check_requirement,
    "description": check_description,
    "aggregate": check_aggregate,
    "key_field": check_key_field,
    "command_types": check_command_types,
    "enhydra_source": check_source,
}


def main() -> int:
    problems = []
    for name, check in CHECKS.items():
        reason = check(VALUES[name])
        if reason is not None:
            problems.append(f"  {name}={VALUES[name]!r} {reason}")
    if problems:
        print("error: cannot generate the project:", *problems, sep="\n", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
