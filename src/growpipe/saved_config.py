"""What a checkpoint's saved config means to a run that reads it: the fields added since it was written (their
values that keep it as it was), what a resumed run may change, and whether the data matches its net."""

from __future__ import annotations

from typing import Any

from growpipe.config import RunConfig, build_config
from growpipe.errors import CheckpointError

RESUMABLE_DIFFERENCES = ("name", "tracking.", "runtime.", "checkpoint.", "train.epochs", "eval.", "grow.max_blocks")
"""Config fields a resumed run may set differently from its checkpoint (by dotted prefix)."""

FIELDS_ADDED_SINCE: dict[str, tuple[Any, tuple[str, Any] | None]] = {
    "net.input_norm": (False, ("net.backbone", "transformer")),
    "eval.restore_best": (False, None),
    "scpl.classifier_norm": (False, ("method", ("scpl", "dascpl"))),
}
"""Config fields added after checkpoints were first written whose default changes what a run does: the value
that keeps a checkpoint written before them as it was (e.g. blocks grown after a resume have no input
LayerNorm, like the blocks restored), and the (field, value or tuple of values) of the configs where it
matters (None: all). Other fields a checkpoint predates take their defaults."""


def _field(config: dict[str, Any], dotted: str, missing: Any = None) -> Any:
    """The value of dotted field `dotted` (e.g. "net.backbone", "method") in a config dict, else `missing`."""
    where: Any = config
    for part in dotted.split("."):
        if not isinstance(where, dict) or part not in where:
            return missing
        where = where[part]
    return where


def with_fields_added_since(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's saved config with FIELDS_ADDED_SINCE filled in where it predates them and they matter."""
    out = dict(config)
    for dotted, (value, only) in FIELDS_ADDED_SINCE.items():
        section, key = dotted.split(".")
        if only is not None:
            want = only[1] if isinstance(only[1], tuple) else (only[1],)
            if _field(config, only[0]) not in want:
                continue
        if isinstance(out.get(section), dict) and key not in out[section]:
            out[section] = {**out[section], key: value}
    return out


def keeping_added_fields(cfg: RunConfig, saved: dict[str, Any]) -> RunConfig:
    """`cfg` with checkpoint config `saved`'s values (as filled by with_fields_added_since) of the fields in
    FIELDS_ADDED_SINCE, for a run that continues that checkpoint from a config of its own (a Tune trial): its
    blocks are then built as they were saved."""
    data = cfg.model_dump(mode="json")
    changed = False
    for dotted in FIELDS_ADDED_SINCE:
        section, key = dotted.split(".")
        kept = _field(saved, dotted, missing=data[section][key])
        if kept != data[section][key]:
            data[section] = {**data[section], key: kept}
            changed = True
    return build_config(data, "the config with the checkpoint's values of fields added since") if changed else cfg


def check_input_matches(saved: dict[str, Any], found: dict[str, Any]) -> None:
    """Refuse data whose shape, classes or vocabulary (InputInfo.to_dict) differ from what a checkpoint's
    net was trained on (`saved`, its manifest's input)."""
    for key, want in saved.items():
        if found.get(key) != want:
            raise CheckpointError(
                f"data: the loaded data's {key} is {found.get(key)} but the checkpoint was trained on {want}; "
                "point data.root at the data it was trained on"
            )


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted config fields whose values differ, other than those a resumed run may change. A field the saved
    config predates (absent from it) counts as its value in `current` only through with_fields_added_since or
    its default: compare against build_config(saved).model_dump(mode="json")."""
    out = []
    for key in sorted(set(saved) | set(current)):
        dotted = f"{prefix}{key}"
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, dotted + ".")
        elif a != b and not dotted.startswith(RESUMABLE_DIFFERENCES):
            out.append(f"{dotted}: checkpoint has {a!r}, this run has {b!r}")
    return out
