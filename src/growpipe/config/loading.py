"""A raw mapping (from a file, --set overrides and GROWPIPE_SET) to a validated RunConfig, every problem one
line; and back to YAML."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from growpipe.config.files import config_key_places, read_run_config
from growpipe.config.problems import KeyPlaces, format_errors, is_union_tag, problem_lines
from growpipe.config.run import RunConfig
from growpipe.envvars import extra_overrides
from growpipe.errors import ConfigError


def parse_value(text: str) -> Any:
    """Parse a --set value with YAML rules (numbers, bools, lists), falling back to the string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """raw["a"]["b"] = value for key "a.b" (sections created as needed)."""
    node = raw
    *head, last = key.strip().split(".")
    for part in head:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = nxt
    node[last] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `raw` with each `dotted.key=value` applied."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set train.lr=0.01")
        key, value = item.split("=", 1)
        if key.strip() == "base":
            raise ConfigError(f"--set {item!r}: base works only in a config file (it names the YAML file that file "
                              "starts from); write base: PATH at the top of the file you pass to --config")  # fmt: skip
        try:
            set_dotted(out, key, parse_value(value))
        except ConfigError as e:
            raise ConfigError(f"--set {e}") from None
    return out


def build_config(raw: dict[str, Any] | None, source: str = "config", yaml_file: Path | None = None,
                 overrides: list[str] | None = None) -> RunConfig:  # fmt: skip
    """Validate a raw mapping; raise ConfigError listing every problem (with its line in `yaml_file`, the
    YAML the mapping was read from, or the --set of `overrides` that gave it)."""
    try:
        return RunConfig.model_validate(raw or {})
    except ValidationError as err:
        raise ConfigError(format_errors(err, source, key_places(yaml_file, overrides))) from None


def key_places(yaml_file: Path | None, overrides: list[str] | None = None) -> KeyPlaces | None:
    """Where each key of a config read from `yaml_file` is: its line there (or in its base), or '--set
    KEY=VALUE' for a key one of `overrides` gives (that replaces what the file has at and under it). None
    without a file: every value then comes from --set."""
    if yaml_file is None:
        return None
    places: KeyPlaces = dict(config_key_places(yaml_file))
    for item in overrides or []:
        key = tuple(item.split("=", 1)[0].strip().split("."))
        places = {k: v for k, v in places.items() if k[: len(key)] != key}
        places[key] = f"--set {item}"
    return places or None


def config_and_problems(raw: dict[str, Any] | None, yaml_file: Path | None = None,
                        overrides: list[str] | None = None) -> tuple[RunConfig | None, list[str]]:  # fmt: skip
    """The config of `raw` and every validation problem (one line each, with its line in `yaml_file` or the
    --set of `overrides` that gave it). With problems, the config has the fields at fault left at their
    defaults, so that the checks that come after validation still run and report theirs in the same list
    (None when even that does not validate)."""
    try:
        return RunConfig.model_validate(raw or {}), []
    except ValidationError as err:  # only now re-read the files for where each key is
        problems = problem_lines(err, key_places(yaml_file, overrides))
        partial = copy.deepcopy(raw or {})
        for _ in range(3):  # a default may make a cross-field check fail in turn: drop that field too
            dropped = [_drop(partial, [str(p) for p in e["loc"] if not is_union_tag(p)]) for e in err.errors()]
            if not any(dropped):
                return None, problems
            try:
                return RunConfig.model_validate(partial), problems
            except ValidationError as again:
                err = again
        return None, problems


def _drop(raw: dict[str, Any], loc: list[str]) -> bool:
    """Remove the value at `loc` (or the nearest part of it `raw` has) from `raw`; whether anything went."""
    node: Any = raw
    for part in loc[:-1]:
        if not isinstance(node, dict) or part not in node:
            break
        if not isinstance(node[part], dict):
            del node[part]
            return True
        node = node[part]
    else:
        if loc and isinstance(node, dict) and loc[-1] in node:
            del node[loc[-1]]
            return True
    return False


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML file (or nothing: all defaults) with its `base:` chain (see read_run_config), apply --set
    overrides (and GROWPIPE_SET's after them), validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_run_config(path)
    overrides = [*(overrides or []), *extra_overrides()]
    raw = apply_overrides(raw, overrides)
    return build_config(raw, str(path) if path is not None else "defaults", Path(path) if path is not None else None,
                        overrides)  # fmt: skip


def dump_config(cfg: RunConfig) -> str:
    """The config as YAML that load_config accepts."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
