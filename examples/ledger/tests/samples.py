"""Commands for the tests, built from the command types the domain declares.

The integration and backfill tests send every command type many times. They fill what they care
about (the key, a name, a note) and leave every other declared field to `sample_value`, a value
of the field's declared type: add a required field to a command and these tests keep running.
A type `sample_value` cannot make stops them before anything is sent, naming the field: teach
`sample_value` that type (or give the field a default).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import msgspec
import msgspec.inspect as mi
from enhydra.plugins import message_types

from ledger.domain import KEY_FIELD, accounts


def declared_commands() -> dict[str, type]:
    """Command type name -> its Struct: the aggregate's own and its handlers' declared ones."""
    found = {cls.__struct_config__.tag: cls for cls in accounts.command_types}
    handlers, _ = message_types(accounts)
    found.update({name: cls for name, cls in handlers.items() if cls is not None})
    return found


COMMANDS = declared_commands()


def sample_value(info: mi.Type, where: str) -> Any:
    """A JSON value of the declared type that its constraints accept; edit it for your types."""
    if isinstance(info, mi.StrType):
        return "x" * max(info.min_length or 1, 1)
    if isinstance(info, mi.IntType | mi.FloatType):
        low = info.ge if info.ge is not None else (info.gt + 1 if info.gt is not None else 1)
        return int(low) if isinstance(info, mi.IntType) else float(low)
    if isinstance(info, mi.BoolType):
        return False
    if isinstance(info, mi.NoneType):
        return None
    if isinstance(info, mi.LiteralType):  # a set: the smallest, so every run sends the same
        return min(info.values, key=lambda v: (type(v).__name__, str(v)))
    if isinstance(info, mi.EnumType):
        return next(iter(info.cls)).value
    if isinstance(info, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        return [sample_value(info.item_type, f"{where}[0]")] * (info.min_length or 0)
    if isinstance(info, mi.DictType):
        return {}
    if isinstance(info, mi.UnionType):
        plain = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return None if len(plain) < len(info.types) else sample_value(plain[0], where)
    if isinstance(info, mi.StructType | mi.DataclassType | mi.TypedDictType):
        required = [f for f in info.fields if f.required]
        return {f.encode_name: sample_value(f.type, f"{where}.{f.name}") for f in required}
    if isinstance(info, mi.DateTimeType):
        return dt.datetime(2026, 1, 1, tzinfo=dt.UTC).isoformat()
    if isinstance(info, mi.DateType):
        return "2026-01-01"
    if isinstance(info, mi.UUIDType):
        return str(uuid.UUID(int=1))
    if isinstance(info, mi.DecimalType):
        return "1"
    if isinstance(info, mi.AnyType):
        return "x"
    raise TypeError(
        f"tests/samples.py: sample_value() cannot make a {type(info).__name__} for {where}: "
        "teach it this type, or give the field a default"
    )


def command(kind: str, key: str, command_id: str, **fields: Any) -> dict[str, Any]:
    """A command of type `kind` for `key`: `fields` where it declares them, samples for the
    other required fields (fields it does not declare are left out)."""
    cls = COMMANDS.get(kind)
    if cls is None:
        raise KeyError(f"tests/samples.py: {kind!r} is not a declared command ({sorted(COMMANDS)})")
    config = cls.__struct_config__
    out: dict[str, Any] = {"command_id": command_id, config.tag_field: config.tag}
    for field in mi.type_info(cls).fields:
        if field.encode_name == KEY_FIELD:
            out[KEY_FIELD] = key
        elif field.name in fields:
            out[field.encode_name] = fields[field.name]
        elif field.required:
            out[field.encode_name] = sample_value(field.type, f"{cls.__name__}.{field.name}")
    try:  # as the service decodes it: a refused sample would only reach the dead-letter queue
        body = {k: v for k, v in out.items() if k != "command_id"}  # the envelope's, not cls's
        msgspec.json.decode(msgspec.json.encode(body), type=cls)
    except msgspec.ValidationError as exc:
        raise ValueError(
            f"tests/samples.py: the sample {cls.__name__} does not fit its type ({exc}): "
            "edit sample_value() or the fields the test passes"
        ) from None
    return out
