"""Run config files: a YAML mapping read with one-line errors (keys given twice refused), the line of each
key, and the `base:` chain merged."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from growpipe.config.problems import KeyPlaces
from growpipe.errors import ConfigError


def yaml_key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Where each key of a YAML mapping is (1-based line), by its path of keys (list items by index)."""
    out: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                here = (*path, str(key.value))
                out[here] = key.start_mark.line + 1
                walk(value, here)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                here = (*path, str(i))
                out[here] = item.start_mark.line + 1
                walk(item, here)

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return out
    if root is not None:
        walk(root, ())
    return out


def read_yaml_mapping(path: str | Path, flag: str, examples: str, top: str) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (empty file: {}); ConfigError naming `flag` when the file is
    missing (see `examples`), not YAML (with the line), or not a mapping of `top`."""
    p = Path(path)
    if not p.is_file():
        what = "is a folder, not a file" if p.is_dir() else "no such file"
        raise ConfigError(f"{flag} {p}: {what}; see {examples} for examples")
    try:
        loaded = yaml.safe_load(p.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{flag} {p}: not a text file; give a YAML file (see {examples})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{p}:{where} not valid YAML ({problem})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of {top}")
    if twice := duplicate_key(p.read_text()):
        key, line, first = twice
        raise ConfigError(f"{p} line {line}: {key} is given twice (also at line {first}); YAML keeps only the last, "
                          "so keep the one you mean and delete the other")  # fmt: skip
    return loaded or {}


def duplicate_key(text: str) -> tuple[str, int, int] | None:
    """(dotted key, its line, the line of its first occurrence) of the first key a mapping of YAML `text` gives
    twice (None: none does). YAML loaders keep the last silently; a merge key (<<) may repeat."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    todo: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())] if root is not None else []
    while todo:
        node, path = todo.pop(0)
        if isinstance(node, yaml.SequenceNode):
            todo += [(item, (*path, str(i))) for i, item in enumerate(node.value)]
        if not isinstance(node, yaml.MappingNode):
            continue
        seen: dict[str, int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            if key.value in seen:
                return ".".join((*path, key.value)), line, seen[key.value]
            seen[key.value] = line
            todo.append((value, (*path, key.value)))
    return None


def read_run_config(path: str | Path) -> dict[str, Any]:
    """A run config file as a raw mapping, its `base:` chain resolved: the base file (a path relative to the
    folder of the file naming it, or absolute; it may name a base of its own) is read first and the file's own
    keys are merged over it (mappings key by key; lists and values replace). ConfigError, one line naming the
    file and the fix, for a base that is missing, not a path, or part of a cycle."""
    return _resolve_bases(Path(path), ())[0]


def config_key_places(path: str | Path) -> KeyPlaces:
    """Where each key of run config file `path` is: its own line, or 'BASE line N' for a key its bases give."""
    return _resolve_bases(Path(path), ())[1]


def _resolve_bases(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], KeyPlaces]:
    """`path`'s mapping merged over its bases', and where each key is (see read_run_config); `chain`: the
    files that named this one as their base, first to last."""
    raw = read_yaml_mapping(path, "--config", "configs/", "sections (method, data, net, ...)")
    places: KeyPlaces = dict(yaml_key_lines(path.read_text()))
    if "base" not in raw:
        return raw, places
    base, line = raw.pop("base"), places.pop(("base",), None)
    at = f"{path} line {line}" if line is not None else str(path)
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{at}: base: {base!r} is not a file path; give the YAML file this config starts from, "
                          "e.g. base: text.yaml")  # fmt: skip
    target, seen = path.parent / base, (*chain, path)
    if any(target.resolve() == p.resolve() for p in seen):
        cycle = " -> ".join(str(p) for p in (*seen, target))
        raise ConfigError(f"{at}: base: {base} makes a cycle ({cycle}); remove the base: that leads back")
    if not target.is_file():
        what = "is a folder, not a file" if target.is_dir() else "no such file"
        raise ConfigError(f"{at}: base: {target}: {what}; give a YAML file relative to {path.parent} "
                          "(this file's folder) or an absolute path")  # fmt: skip
    under, under_places = _resolve_bases(target, seen)
    kept = {key: f"{target} line {place}" if isinstance(place, int) else place
            for key, place in under_places.items() if not _replaced_by(raw, key)}  # fmt: skip
    return merge_mappings(under, raw), {**kept, **places}


def merge_mappings(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged onto a copy of `under`: mappings key by key, anything else (lists, values) replaced."""
    out = copy.deepcopy(under)
    for key, value in over.items():
        mine = out.get(key)
        out[key] = (
            merge_mappings(mine, value) if isinstance(value, dict) and isinstance(mine, dict) else copy.deepcopy(value)
        )
    return out


def _replaced_by(raw: dict[str, Any], key: tuple[str, ...]) -> bool:
    """Whether `raw` gives `key` or a value (not a mapping) above it, so that a base's `key` is not used."""
    node: Any = raw
    for part in key:
        if not isinstance(node, dict):
            return True
        if part not in node:
            return False
        node = node[part]
    return True
