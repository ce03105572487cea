"""Run configuration: YAML in, validated pydantic models out.

Every field has a default, so an empty YAML is a valid run (digits, MLP, AL). Errors from a bad file
are collected and reported together, one line each, naming the field and what to do about it.

The public names are importable from here (`from growpipe.config import RunConfig, load_config`); the
modules, each importing only those listed above it:
  names     what may name a run (check_run_name)
  base      Strict, the base of every config model
  problems  validation errors as one line each, with the line of the file (or the --set) at fault
  data, net, grow, engines, records   the sections of a run config
  run       RunConfig: the sections checked together, and the answers derived from them
  files     YAML files: read, keys given twice refused, the line of each key, the `base:` chain merged
  loading   a file and --set overrides to a validated RunConfig (load_config, build_config), and back
"""

from growpipe.config.data import DATASET_NAMES, DATASET_PREFIXES, DataSpec, FeatureGroupsSpec, NormalizeSpec
from growpipe.config.engines import (
    ENGINES,
    MOVED_RUNTIME_FIELDS,
    BPPipelineSpec,
    DDPSpec,
    PipelineSpec,
    RuntimeSpec,
)
from growpipe.config.files import (
    config_key_places,
    duplicate_key,
    merge_mappings,
    read_run_config,
    read_yaml_mapping,
    yaml_key_lines,
)
from growpipe.config.grow import CacheSpec, GrowRequest, GrowSpec, GrowStep, PlateauSpec, parse_grow_request
from growpipe.config.loading import (
    apply_overrides,
    build_config,
    config_and_problems,
    dump_config,
    key_places,
    load_config,
    parse_value,
    set_dotted,
)
from growpipe.config.names import RUN_NAME, check_run_name, run_name_problem
from growpipe.config.net import ALSpec, LRScheduleSpec, NetSpec, OptimSpec, RuleSettings, SCPLSpec
from growpipe.config.problems import KeyPlaces, format_errors, problem_lines
from growpipe.config.records import CheckpointSpec, EvalSpec, TrackingSpec
from growpipe.config.run import RunConfig

__all__ = [
    "DATASET_NAMES",
    "DATASET_PREFIXES",
    "ENGINES",
    "MOVED_RUNTIME_FIELDS",
    "RUN_NAME",
    "ALSpec",
    "BPPipelineSpec",
    "CacheSpec",
    "CheckpointSpec",
    "DDPSpec",
    "DataSpec",
    "EvalSpec",
    "FeatureGroupsSpec",
    "GrowRequest",
    "GrowSpec",
    "GrowStep",
    "KeyPlaces",
    "NetSpec",
    "NormalizeSpec",
    "LRScheduleSpec",
    "OptimSpec",
    "PipelineSpec",
    "PlateauSpec",
    "RuleSettings",
    "RunConfig",
    "RuntimeSpec",
    "SCPLSpec",
    "TrackingSpec",
    "apply_overrides",
    "build_config",
    "check_run_name",
    "config_and_problems",
    "config_key_places",
    "dump_config",
    "duplicate_key",
    "format_errors",
    "key_places",
    "load_config",
    "merge_mappings",
    "parse_grow_request",
    "parse_value",
    "problem_lines",
    "read_run_config",
    "read_yaml_mapping",
    "run_name_problem",
    "set_dotted",
    "yaml_key_lines",
]
