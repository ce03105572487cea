"""What a checkpoint's manifest means to a run that reads it: the one versioned reader (current_manifest: an
older format's manifest in today's form), what a resumed run may change, and whether the data matches its net."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from growpipe.config import OptimSpec, RuleSettings
from growpipe.errors import CheckpointError
from growpipe.manifest import FORMAT_VERSION
from growpipe.nn.methods import block_arch

RESUMABLE_DIFFERENCES = ("name", "tracking.", "runtime.", "checkpoint.", "train.epochs", "eval.", "grow.max_blocks",
                         "grow.init", "grow.eval_at_growth")  # fmt: skip
"""Config fields a resumed run may set differently from its checkpoint (by dotted prefix)."""


def current_manifest(manifest: dict[str, Any], path: str) -> dict[str, Any]:
    """`manifest` (of checkpoint directory `path`, its format checked by parse_manifest) in the current
    format's form, each older format upgraded one step at a time (UPGRADES): every reader sees one form."""
    while (version := manifest["format_version"]) < FORMAT_VERSION:
        manifest = {**UPGRADES[version](manifest, path), "format_version": version + 1}
    return manifest


def _from_format_2(manifest: dict[str, Any], path: str) -> dict[str, Any]:
    """Format 2 -> 3. Format 2 built a block's heads from the run config: each spec takes the config's rule and
    its architecture choices (block_arch). The config takes the values its run had of the fields added while
    format 2 was written whose defaults would change what the run does: a resume then goes on as the run
    went (blocks it grows have no input LayerNorm, like those restored; no model selection); other fields
    the config predates take their defaults when it is read."""
    config = dict(manifest.get("config") or {})
    method = config.get("method", "al")
    if _get(config, "net", "backbone") == "transformer":
        config = _set_missing(config, "net", "input_norm", False)
    config = _set_missing(config, "eval", "restore_best", False)
    if method in ("scpl", "dascpl"):
        config = _set_missing(config, "scpl", "classifier_norm", False)
    try:
        rule = RuleSettings.model_validate({"method": method, "al": config.get("al", {}),
                                            "scpl": config.get("scpl", {})})  # fmt: skip
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise CheckpointError(f"checkpoint {path}: its config's {where} is not one this growpipe reads "
                              f"({first['msg']}); evaluate it with the growpipe that wrote it") from None  # fmt: skip
    arch = block_arch(rule)
    topology = [{**d, "method": method, "arch": dict(arch)} if isinstance(d, dict) else d
                for d in manifest.get("topology") or []]  # fmt: skip
    return {**manifest, "config": config, "topology": topology}


UPGRADES: dict[int, Callable[[dict[str, Any], str], dict[str, Any]]] = {2: _from_format_2}
"""Format N -> the upgrade of its manifest to format N + 1."""


def _get(config: dict[str, Any], section: str, key: str) -> Any:
    part = config.get(section)
    return part.get(key) if isinstance(part, dict) else None


def _set_missing(config: dict[str, Any], section: str, key: str, value: Any) -> dict[str, Any]:
    """`config` with `section.key` set to `value` where the section is there without the key."""
    part = config.get(section)
    if not isinstance(part, dict) or key in part:
        return config
    return {**config, section: {**part, key: value}}


def inference_rule(manifest: dict[str, Any]) -> RuleSettings:
    """The settings a checkpoint's blocks are built with to answer (evaluate, serve, the MLflow model): its
    specs' rule, and the precision its run computed in (train.precision: a compute mode, not the
    architecture; fp32 when the config does not say). The optimizer is never used: load the blocks' modules
    only (their states without "optimizers")."""
    topology = manifest.get("topology") or [{}]
    train = (manifest.get("config") or {}).get("train")
    precision = train.get("precision") if isinstance(train, dict) else None
    return RuleSettings(method=topology[0].get("method", "al"),
                        optim=OptimSpec(precision="bf16" if precision == "bf16" else "fp32"))  # fmt: skip


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
    config predates (absent from it) counts as the value current_manifest gave it, or its default: compare
    against build_config(saved).model_dump(mode="json")."""
    out = []
    for key in sorted(set(saved) | set(current)):
        dotted = f"{prefix}{key}"
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, dotted + ".")
        elif a != b and not dotted.startswith(RESUMABLE_DIFFERENCES):
            out.append(f"{dotted}: checkpoint has {a!r}, this run has {b!r}")
    return out
