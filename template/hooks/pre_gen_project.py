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
