"""Jinja filters the service template uses to turn the prompts into code.

Cookiecutter loads this module (cookiecutter.json: `_extensions`) with the template folder on
sys.path. The filters are pure, so tests/template checks them directly.
"""

from __future__ import annotations

import re

from jinja2 import Environment
from jinja2.ext import Extension

# Verbs whose past participle does not follow the rules below (the ones commands often use).
IRREGULAR = {
    "begin": "begun",
    "bring": "brought",
    "build": "built",
    "buy": "bought",
    "commit": "committed",
    "do": "done",
    "find": "found",
    "forbid": "forbidden",
    "get": "got",
    "give": "given",
    "hold": "held",
    "keep": "kept",
    "leave": "left",
    "lend": "lent",
    "lose": "lost",
    "make": "made",
    "pay": "paid",
    "put": "put",
    "read": "read",
    "refer": "referred",
    "run": "run",
    "sell": "sold",
    "send": "sent",
    "set": "set",
    "spend": "spent",
    "split": "split",
    "submit": "submitted",
    "take": "taken",
    "transfer": "transferred",
    "withdraw": "withdrawn",
    "write": "written",
}
VOWELS = "aeiou"
COMMAND = re.compile(r"^[a-z][a-z0-9_]*$")


def _past_word(verb: str) -> str:
    if verb in IRREGULAR:
        return IRREGULAR[verb]
    if verb.endswith("e"):
        return verb + "d"
    if len(verb) > 1 and verb.endswith("y") and verb[-2] not in VOWELS:
        return verb[:-1] + "ied"
    vowel_groups = len(re.findall(f"[{VOWELS}]+", verb))
    if (
        vowel_groups == 1
        and len(verb) >= 3
        and verb[-1] not in VOWELS + "wxy"
        and verb[-2] in VOWELS
        and verb[-3] not in VOWELS
    ):
        return verb + verb[-1] + "ed"  # ship -> shipped, stop -> stopped
    return verb + "ed"


def past_tense(command: str) -> str:
    """The event type for a command type: register -> registered, open_account -> opened_account.

    Only the first word changes; names that are not lowercase words are returned with `_done`.
    """
    if not COMMAND.match(command):
        return f"{command}_done"
    first, sep, rest = command.partition("_")
    return _past_word(first) + sep + rest


def command_list(text: str) -> list[str]:
    """The command types from the prompt's comma-separated answer, e.g. 'open, deposit'."""
    return [name.strip() for name in str(text).split(",") if name.strip()]


def class_name(name: str) -> str:
    """The Python class declaring a command, event or state type: open_account -> OpenAccount."""
    return "".join(part[:1].upper() + part[1:] for part in str(name).split("_"))


REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?(.*)$")


def with_extra(requirement: str, extra: str) -> str:
    """The requirement with one more extra: enhydra>=0.1 -> enhydra[dev-tools]>=0.1."""
    match = REQUIREMENT.match(str(requirement))
    if match is None:
        return str(requirement)
    name, extras, rest = match.groups()
    names = [e.strip() for e in (extras or "").split(",") if e.strip()]
    if extra not in names:
        names.append(extra)
    return f"{name}[{','.join(names)}]{rest}"


class DomainFilters(Extension):
    """Registers `past_tense`, `command_list`, `class_name` and `with_extra` as Jinja filters."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.filters["past_tense"] = past_tense
        environment.filters["command_list"] = command_list
        environment.filters["class_name"] = class_name
        environment.filters["with_extra"] = with_extra
