"""Validation errors as one line per problem, naming the field as the user wrote it and where it is (a
line of the file or of its base, or the --set that gave it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

KeyPlaces = dict[tuple[str, ...], int | str]
"""Where each key of a config is, by its path of keys: a line of the file itself (int), or 'FILE line N' for a
key that comes from a base file."""
KeyLines = Mapping[tuple[str, ...], int | str]
"""KeyPlaces as the readers below take them (any mapping: yaml_key_lines' lines of one file too)."""


def format_errors(err: ValidationError, source: str, lines: KeyLines | None = None) -> str:
    """A header and one line per problem, the field named as the user wrote it (`lines`: where each YAML key
    is)."""
    problems = problem_lines(err, lines)
    return "\n".join([f"{source}: {len(problems)} problem(s)", *(f"  {p}" for p in problems)])


def problem_lines(err: ValidationError, lines: KeyLines | None = None) -> list[str]:
    """One line per problem of a validation error: 'field (line N): what is wrong and the fix'."""
    problems = []
    for e in err.errors():
        tags = [str(p) for p in e["loc"] if is_union_tag(p)]
        if tags and _other_member_meant(tags[0], e):
            continue  # a `literal | model` field: only the member the value was meant for says what is wrong
        loc = tuple(str(p) for p in e["loc"] if not is_union_tag(p))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling (see configs/ for every field)"
        elif e["type"] == "literal_error":
            msg = f"got {e['input']!r}; {msg.lower()}"
        elif e["type"] == "finite_number":
            msg = f"got {e['input']}; give a finite number (inf and nan are not values a run can use)"
        where = _line_of(loc, lines)
        field = f"{'.'.join(loc)}{where}: " if loc else ""  # a whole-model check names its fields itself
        problems += [f"{field}{part}" for part in msg.splitlines()]
    return problems


def _other_member_meant(tag: str, error: Any) -> bool:
    """Whether this error of a union member is noise: a mapping was meant for the model member (not the
    literal), anything else for the literal member (not the model)."""
    if tag.startswith("literal["):
        return isinstance(error["input"], dict)
    return not isinstance(error["input"], dict) and error["type"] in (
        "model_type",
        "model_attributes_type",
        "dict_type",
    )


def is_union_tag(part: Any) -> bool:
    """pydantic's name for a member of a union in an error location, e.g. `function-after[...]`."""
    return isinstance(part, str) and ("[" in part or "(" in part)


def _line_of(loc: tuple[str, ...], lines: KeyLines | None) -> str:
    """' (line N)' (or ' (BASE line N)') of the deepest key of `loc` the YAML file has, or ''."""
    for n in range(len(loc), 0, -1):
        if lines and loc[:n] in lines:
            place = lines[loc[:n]]
            return f" (line {place})" if isinstance(place, int) else f" ({place})"
    return ""
