"""`enhydra send`'s pure part: which line becomes which record, and which line stops it."""

from __future__ import annotations

import pytest

from enhydra.cli.send import BadLine, record_of, records


def test_a_line_is_sent_as_written_keyed_by_its_field() -> None:
    line = '{"item": "apple",  "n": 1}'
    assert record_of(line, "item") == (b"apple", line.encode())
    assert record_of('{"id": 42}', "id") == (b"42", b'{"id": 42}')


def test_without_a_key_field_any_json_goes_unkeyed() -> None:
    assert record_of("[1, 2]", None) == (None, b"[1, 2]")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not JSON (Expecting property name enclosed in double quotes at column 2)"),
        ('"text"', "not a JSON object, so it has no 'item' field"),
        ('{"other": 1}', "no 'item' field (the key)"),
        ('{"item": null}', "no 'item' field (the key)"),
        ('{"item": true}', "'item' is true: a key must be a string or integer"),
        ('{"item": {"a": 1}}', """'item' is {"a": 1}: a key must be a string or integer"""),
        ('{"item": ""}', "'item' is empty"),
    ],
)
def test_lines_that_cannot_be_sent_say_why(line: str, reason: str) -> None:
    with pytest.raises(ValueError) as caught:
        record_of(line, "item")
    assert str(caught.value) == reason


def test_records_skip_blank_lines_and_name_the_bad_one() -> None:
    sources = [
        ("a.jsonl", ['{"k": "x"}\n', "\n", '{"k": "y"}\n']),
        ("b.jsonl", ['{"k": "z"}\n', "  \n", '{"j": 1}\n', '{"k": "never"}\n']),
    ]
    produced = []
    with pytest.raises(BadLine) as caught:
        for record in records(sources, "k"):
            produced.append(record[0])
    assert produced == [b"x", b"y", b"z"]
    assert str(caught.value) == "b.jsonl line 3: no 'k' field (the key)"
