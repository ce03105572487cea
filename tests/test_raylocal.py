"""raylocal/cluster.yaml is a valid config for Ray's cluster launcher (its own JSON schema)."""

import json
from pathlib import Path

import jsonschema
import ray
import yaml

from tests.conftest import REPO


def test_cluster_yaml_validates_against_rays_cluster_schema():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((REPO / "raylocal" / "cluster.yaml").read_text())
    jsonschema.validate(config, schema)
    assert config["provider"]["type"] == "local"
    assert any("--dashboard-host=127.0.0.1" in c for c in config["head_start_ray_commands"])


def test_a_misspelled_field_is_caught_by_the_same_check():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((REPO / "raylocal" / "cluster.yaml").read_text())
    config["idle_timeout_minute"] = config.pop("idle_timeout_minutes")
    try:
        jsonschema.validate(config, schema)
    except jsonschema.ValidationError as e:
        assert "idle_timeout_minute" in str(e)
    else:
        raise AssertionError("the schema accepted a misspelled field")
