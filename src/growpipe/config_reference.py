"""The configuration reference (docs/configuration.md), generated from the config models' field docstrings.

    python -m growpipe.config_reference docs/configuration.md     # write it
    python -m growpipe.config_reference                           # print it

A test fails when a field has no docstring or the committed file differs from what this generates.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from growpipe.config import RunConfig

HEADER = """# Configuration

One YAML file, validated by pydantic before anything starts; every field has a default (an empty file
trains AL on digits). `--set key=value` overrides any field with YAML syntax (`--set net.widths=[32,64]`,
`--set "grow.schedule=[{kind: layer, epochs: 2}]"`). Examples for every method x dataset are in
`configs/`. Unknown fields and bad values are refused, one line per problem, naming the field.

A file can start from another (any config file: `--config`, a sweep's `config:`): `base: text.yaml` at its
top level reads that file first (a path relative to the folder of the file naming it, or absolute; a base
may have a base of its own), then merges this file over it: sections key by key, while lists and values
replace. `base` is not a field: it works only in a file (not with `--set`), and the config a run records
(checkpoints, MLflow, `partition --write`) is the merged one. A problem with a key the base gives names
the base file and its line.

Generated from `src/growpipe/config/` by `python -m growpipe.config_reference docs/configuration.md`;
do not edit by hand.
"""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The config model a field holds (directly, optionally, or as list items), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "see below"
    return f"`{json.dumps(value)}`"


def _type(annotation: Any) -> str:
    """A field's type in words: `al / scpl`, `int or null`, `list of float`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " / ".join(str(a) for a in args)
    if origin is list:
        return f"list of {_type(args[0])}"
    if args:  # a union
        return " or ".join("null" if a is type(None) else _type(a) for a in args)
    return getattr(annotation, "__name__", str(annotation))


def missing_docstrings(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """Dotted names of the fields without a docstring."""
    out = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        if not (field.description or "").strip():
            out.append(dotted)
        sub = _model_of(field.annotation)
        if sub is not None:
            out += missing_docstrings(sub, f"{dotted}.")
    return out


def _sections(model: type[BaseModel], prefix: str, out: list[tuple[str, type[BaseModel]]]) -> None:
    out.append((prefix, model))
    for name, field in model.model_fields.items():
        sub = _model_of(field.annotation)
        if sub is not None:
            many = typing.get_origin(field.annotation) is list
            _sections(sub, f"{prefix}{name}{'[]' if many else ''}.", out)


def reference() -> str:
    """The whole reference as Markdown."""
    sections: list[tuple[str, type[BaseModel]]] = []
    _sections(RunConfig, "", sections)
    lines = [HEADER]
    for prefix, model in sections:
        title = prefix.rstrip(".") or "top level"
        lines.append(f"## `{title}`\n" if prefix else "## top level\n")
        lines.append((model.__doc__ or "").strip().replace("\n    ", "\n") + "\n")
        lines.append("| field | type | default | meaning |")
        lines.append("| --- | --- | --- | --- |")
        for name, field in model.model_fields.items():
            doc = " ".join((field.description or "").split()).replace("|", "\\|")
            lines.append(f"| `{prefix}{name}` | {_type(field.annotation)} | {_default(field)} | {doc} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m growpipe.config_reference [FILE]`: the config reference on stdout, or written to FILE."""
    parser = argparse.ArgumentParser(prog="python -m growpipe.config_reference", description=main.__doc__)
    parser.add_argument("file", nargs="?", help="write the reference here (docs/configuration.md)")
    args = parser.parse_args(argv)
    text = reference()
    if args.file:
        Path(args.file).write_text(text)
        print(f"wrote {args.file}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
