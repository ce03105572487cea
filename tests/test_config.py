import re
from pathlib import Path

import pytest

from growpipe.config import RunConfig, apply_overrides, build_config, dump_config, load_config
from growpipe.errors import ConfigError
from tests.conftest import REPO


def test_empty_config_is_valid_defaults():
    cfg = build_config({})
    assert cfg.method == "al" and cfg.data.name == "digits" and cfg.net.backbone == "mlp"


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"method": "sgd"}, "method: got 'sgd'"),
        ({"net": {"backbone": "vgg"}}, "net.backbone: got 'vgg'"),
        ({"data": {"name": "mnist"}}, "data.name: unknown dataset 'mnist'"),
        ({"eval": {"thresholds": [0.5, 1.5]}}, "eval.thresholds: thresholds [1.5] are outside [0, 1]"),
        ({"net": {"blocks": 2, "widths": [64, 64, 64]}}, "net: widths has 3 entries but blocks is 2"),
        ({"grow": {"schedule": [{"kind": "feature", "group": "chunk9"}]}}, "unknown feature group 'chunk9'"),
        ({"trian": {}}, "trian: unknown field"),
        ({"pipeline": {"window": 2, "packets_per_call": 4}}, "pipeline: packets_per_call (4) is more than window (2)"),
        ({"runtime": {"on_lost_node": "retry"}}, "runtime.on_lost_node: got 'retry'"),
        ({"runtime": {"engine": "pipedream"}}, "runtime.engine: got 'pipedream'"),
        (
            {"method": "bp", "runtime": {"engine": "ddp"}, "pipeline": {"window": 2}},
            "pipeline.window: applies to runtime.engine pipeline, and this run's engine is ddp; remove it",
        ),
        (
            {"method": "bp", "ddp": {"workers": 2}},
            "ddp.workers: applies to runtime.engine ddp, and this run's engine is gpipe",
        ),
        ({"method": "al", "runtime": {"engine": "1f1b"}}, "runtime.engine: 1f1b is BP on Ray (method bp)"),
        ({"method": "bp", "runtime": {"engine": "pipeline"}}, "method bp takes gpipe, 1f1b or ddp"),
        (
            {
                "method": "bp",
                "runtime": {"engine": "1f1b"},
                "bp_pipeline": {"spectrain": True},
                "ddp": {"min_workers": 1},
            },
            "ddp.min_workers: applies to runtime.engine ddp",
        ),
        ({"runtime": {"window": 4}}, "runtime: window moved to pipeline.window; set pipeline.window instead"),
        ({"runtime": {"bp_schedule": "ddp"}}, "bp_schedule moved to runtime.engine (gpipe, 1f1b or ddp)"),
        ({"runtime": {"placement_timeout_s": 0}}, "runtime.placement_timeout_s:"),
    ],
)
def test_bad_fields_name_the_field_and_the_fix(raw, needle):
    with pytest.raises(ConfigError) as e:
        build_config(raw)
    assert needle in str(e.value)


def test_the_engine_is_chosen_in_one_place():
    assert build_config({}).engine() == "pipeline" and build_config({"method": "bp"}).engine() == "gpipe"
    assert build_config({"method": "bp", "runtime": {"engine": "ddp"}, "ddp": {"workers": 3}}).engine() == "ddp"


def test_a_setting_of_another_engine_is_one_line_exit_2_from_the_cli_and_an_error_from_the_api(capsys):
    from growpipe.api import train
    from growpipe.cli import main

    args = ["train", "--set", "method=bp", "--set", "runtime.engine=ddp", "--set", "pipeline.window=2"]
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert any("pipeline.window: applies to runtime.engine pipeline, and this run's engine is ddp" in e for e in err)
    with pytest.raises(ConfigError, match="pipeline.window: applies to runtime.engine pipeline"):
        train({"method": "bp", "runtime": {"engine": "ddp"}, "pipeline": {"window": 2}}, runtime="local")
    with pytest.raises(ConfigError, match="runtime.engine: got 'pipedream'"):
        train({"method": "bp", "runtime": {"engine": "pipedream"}}, runtime="local")


def test_all_errors_are_reported_together():
    with pytest.raises(ConfigError) as e:
        build_config({"method": "x", "net": {"backbone": "y"}, "data": {"batch_size": 0}})
    text = str(e.value)
    assert "3 problem(s)" in text
    assert all(f in text for f in ("method:", "net.backbone:", "data.batch_size:"))
    assert all(len(line) < 200 for line in text.splitlines())


def test_feature_group_must_be_declared_and_not_base():
    groups = {"scheme": "chunks", "count": 4, "base": 2}
    ok = build_config(
        {"data": {"feature_groups": groups}, "grow": {"schedule": [{"kind": "feature", "group": "chunk2"}]}}
    )
    assert ok.data.feature_groups.side_names() == ["chunk2", "chunk3"]
    with pytest.raises(ConfigError, match="declares chunk2, chunk3"):
        build_config(
            {"data": {"feature_groups": groups}, "grow": {"schedule": [{"kind": "feature", "group": "chunk0"}]}}
        )


def test_set_overrides_switch_method_and_nested_fields(tmp_path: Path):
    p = tmp_path / "c.yaml"
    p.write_text("method: al\ntrain:\n  epochs: 3\n")
    cfg = load_config(p, ["method=scpl", "train.lr=0.01", "eval.thresholds=[0.5, 0.9]"])
    assert (cfg.method, cfg.train.lr, cfg.train.epochs, cfg.eval.thresholds) == ("scpl", 0.01, 3, [0.5, 0.9])
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["train.lr"])


def test_missing_or_malformed_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)


def test_dump_round_trips():
    cfg = build_config({"method": "dascpl", "net": {"blocks": 3}})
    assert RunConfig.model_validate(__import__("yaml").safe_load(dump_config(cfg))) == cfg


def test_every_shipped_config_validates_for_every_method():
    files = sorted((REPO / "configs").glob("*.yaml"))
    assert files, "configs/ holds the example configs"
    for f in files:
        for method in ("al", "scpl", "dascpl", "bp"):
            load_config(f, [f"method={method}"])


def test_an_example_config_exists_per_method_and_dataset():
    names = {f.stem for f in (REPO / "configs").glob("*.yaml")}
    for ds in ("digits", "fashion-mnist", "20newsgroups"):
        for m in ("al", "scpl", "dascpl", "bp"):
            assert f"{ds}-{m}" in names


def test_every_config_field_has_a_docstring_and_the_reference_is_current():
    from growpipe.config_reference import missing_docstrings, reference
    from tests.conftest import REPO

    assert missing_docstrings() == [], "document these fields in src/growpipe/config/"
    committed = (REPO / "docs" / "configuration.md").read_text()
    assert committed == reference(), "stale: python -m growpipe.config_reference docs/configuration.md"


def test_config_problems_leave_a_config_for_the_checks_that_follow():
    """Each field at fault falls back to its default so the checks after validation still run (prepare_run
    lists their problems with these)."""
    from growpipe.config import config_and_problems

    raw = {"net": {"widht": 3, "blocks": 3}, "runtime": {"engine": "x"}, "train": {"epochs": 2}}
    cfg, problems = config_and_problems(raw)
    assert cfg is not None and (cfg.net.blocks, cfg.train.epochs, cfg.runtime.engine) == (3, 2, "auto")
    assert [p.split(":")[0] for p in problems] == ["net.widht", "runtime.engine"]
    assert raw["runtime"] == {"engine": "x"}  # the caller's mapping is left as it was
    cfg, problems = config_and_problems({"grow": {"on_plateau": {}}})  # a section's own check: it falls back too
    assert (
        cfg is not None
        and cfg.grow.on_plateau is None
        and problems == ["grow: max_blocks is needed with every_epochs / on_plateau: the net stops growing there"]
    )
    mixed = {"data": {"augment": ["hflip"], "feature_groups": {"scheme": "chunks", "count": 2}}}
    assert config_and_problems(mixed) == (None, [  # a check across sections: nothing to fall back on
        "data.augment: crops and flips would move pixels across data.feature_groups; choose one"
    ])  # fmt: skip
    assert config_and_problems({"train": {"epochs": 1}}) == (RunConfig.model_validate({"train": {"epochs": 1}}), [])


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_base_is_read_first_and_the_file_merged_over_it(tmp_path: Path):
    _write(tmp_path / "base.yaml", "method: scpl\ndata:\n  batch_size: 32\n  vocab_size: 900\n"
                                   "eval:\n  thresholds: [0.1, 0.2, 0.3]\ntrain:\n  epochs: 5\n")  # fmt: skip
    child = _write(tmp_path / "child.yaml", "base: base.yaml\ndata:\n  batch_size: 16\n"
                                            "eval:\n  thresholds: [0.9]\n")  # fmt: skip
    cfg = load_config(child, ["train.lr=0.01"])
    assert (cfg.method, cfg.data.batch_size, cfg.data.vocab_size) == ("scpl", 16, 900)  # nested keys merge
    assert cfg.eval.thresholds == [0.9] and (cfg.train.epochs, cfg.train.lr) == (5, 0.01)  # a list replaces
    assert "base" not in __import__("yaml").safe_load(dump_config(cfg))  # what a checkpoint stores: resolved


def test_a_base_path_is_relative_to_the_file_naming_it_and_bases_chain(tmp_path: Path, monkeypatch):
    _write(tmp_path / "shared" / "root.yaml", "seed: 7\nnet:\n  blocks: 3\n  width: 32\n")
    _write(tmp_path / "shared" / "mid.yaml", "base: root.yaml\nmethod: dascpl\nnet:\n  width: 48\n")
    _write(tmp_path / "runs" / "leaf.yaml", "base: ../shared/mid.yaml\nnet:\n  blocks: 4\n")
    _write(tmp_path / "abs.yaml", f"base: {tmp_path / 'runs' / 'leaf.yaml'}\nseed: 1\n")
    monkeypatch.chdir(_write(tmp_path / "elsewhere" / "x", "").parent)
    cfg = load_config("../runs/leaf.yaml")
    assert (cfg.seed, cfg.method, cfg.net.blocks, cfg.net.width) == (7, "dascpl", 4, 48)
    cfg = load_config(tmp_path / "abs.yaml")  # an absolute base path
    assert (cfg.seed, cfg.method, cfg.net.blocks, cfg.net.width) == (1, "dascpl", 4, 48)


@pytest.mark.parametrize(
    ("files", "overrides", "needle"),
    [
        (
            {"a.yaml": "base: gone.yaml\n"},
            [],
            "a.yaml line 1: base: {tmp}/gone.yaml: no such file; give a YAML file relative to {tmp} (this file's "
            "folder) or an absolute path",
        ),
        (
            {"a.yaml": "seed: 1\nbase: [x.yaml]\n"},
            [],
            "a.yaml line 2: base: ['x.yaml'] is not a file path; give the YAML file this config starts from, e.g. "
            "base: text.yaml",
        ),
        (
            {"a.yaml": "base: b.yaml\n", "b.yaml": "base: a.yaml\n"},
            [],
            "b.yaml line 1: base: a.yaml makes a cycle ({tmp}/a.yaml -> {tmp}/b.yaml -> {tmp}/a.yaml); remove the "
            "base: that leads back",
        ),
        ({"a.yaml": "base: a.yaml\n"}, [], "makes a cycle ({tmp}/a.yaml -> {tmp}/a.yaml)"),
        (
            {"a.yaml": "seed: 1\n", "b.yaml": ""},
            ["base=b.yaml"],
            "--set 'base=b.yaml': base works only in a config file (it names the YAML file that file starts from); "
            "write base: PATH at the top of the file you pass to --config",
        ),
    ],
)
def test_a_bad_base_is_one_line_naming_the_file_and_the_fix(tmp_path: Path, files, overrides, needle):
    for name, text in files.items():
        _write(tmp_path / name, text)
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "a.yaml", overrides)
    assert len(str(e.value).splitlines()) == 1 and needle.format(tmp=tmp_path) in str(e.value)


def test_a_field_problem_names_the_file_the_key_is_in(tmp_path: Path):
    from growpipe.prepare import read_config

    _write(tmp_path / "base.yaml", "seed: 0\ndata:\n  batch_size: 0\n")
    child = _write(tmp_path / "child.yaml", "base: base.yaml\nmethod: sgd\n")
    with pytest.raises(ConfigError) as e:
        load_config(child)
    text = str(e.value)
    assert "method (line 2): got 'sgd'" in text and f"data.batch_size ({tmp_path}/base.yaml line 3):" in text
    _, problems = read_config(str(child))  # what `growpipe train` lists with the run's other problems
    assert [p.split(":")[0] for p in problems] == ["method (line 2)", f"data.batch_size ({tmp_path}/base.yaml line 3)"]


def test_the_20newsgroups_configs_are_the_text_recipe_with_their_method():
    text = load_config(REPO / "configs" / "text.yaml").model_dump(mode="json")
    assert (text["data"]["min_count"], text["data"]["max_len_percentile"], text["data"]["val_fraction"],
            text["train"]["epochs"]) == (2, 95, 0.1, 8)  # fmt: skip
    for method in ("al", "scpl", "dascpl", "bp"):
        path = REPO / "configs" / f"20newsgroups-{method}.yaml"
        assert "base: text.yaml" in path.read_text()
        assert load_config(path).model_dump(mode="json") == {**text, "method": method}


def test_a_missing_base_is_one_line_and_exit_2_from_the_command(tmp_path: Path, capsys):
    from growpipe.cli import main

    config = _write(tmp_path / "run.yaml", "base: nowhere/common.yaml\nmethod: scpl\n")
    assert main(["train", "--runtime", "local", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"growpipe train: error: {config} line 1: base: {tmp_path}/nowhere/common.yaml: no such file; "
                   f"give a YAML file relative to {tmp_path} (this file's folder) or an absolute path"]  # fmt: skip


def _float_fields(model: type, prefix: str = "") -> list[str]:
    """Every float field (float, float | None, list[float]) of a config model and its sections, dotted."""
    import typing

    from pydantic import BaseModel

    out = []
    for name, field in model.model_fields.items():
        kinds = typing.get_args(field.annotation) or (field.annotation,)
        sections = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if sections and name != "normalize":  # data.normalize checks its own entries (test_data)
            out += _float_fields(sections[0], f"{prefix}{name}.")
        elif float in kinds or any(typing.get_args(k) == (float,) for k in kinds):
            out.append(f"{prefix}{name}")
    return out


def test_inf_and_nan_are_refused_in_every_float_field_naming_it():
    fields = _float_fields(RunConfig)
    assert {"train.lr", "runtime.cpus_per_stage", "eval.thresholds", "grow.cache.max_memory_mb"} <= set(fields)
    for field in fields:
        for value in ("inf", "-.inf", ".nan"):
            listed = f"[{value}]" if field == "eval.thresholds" else value
            with pytest.raises(ConfigError) as e:
                load_config(None, [f"{field}={listed}"])
            lines = str(e.value).splitlines()
            said = rf"  {re.escape(field)}(\.0)?: got (-?inf|nan); give a finite number"
            assert len(lines) == 2 and re.match(said, lines[1]), lines


def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path: Path, capsys):
    from growpipe.cli import main

    config = _write(tmp_path / "run.yaml", "method: scpl\ntrain:\n  lr: 0.1\n  epochs: 2\n  lr: 0.5\n")
    with pytest.raises(ConfigError) as e:
        load_config(config)
    assert str(e.value) == (f"{config} line 5: train.lr is given twice (also at line 3); YAML keeps only the last, so "
                            "keep the one you mean and delete the other")  # fmt: skip
    _write(tmp_path / "base.yaml", "seed: 1\nseed: 2\n")
    child = _write(tmp_path / "child.yaml", "base: base.yaml\nmethod: scpl\n")
    with pytest.raises(ConfigError, match=r"base.yaml line 2: seed is given twice \(also at line 1\)"):
        load_config(child)
    merged = _write(tmp_path / "anchors.yaml", "common: &c {lr: 0.1}\ntrain:\n  <<: *c\n  lr: 0.2\n")
    assert "given twice" not in str(pytest.raises(ConfigError, load_config, merged).value)  # a merge may repeat
    assert main(["train", "--runtime", "local", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.lr is given twice" in err[0]


def test_a_bad_value_from_set_is_said_to_come_from_set_not_from_the_files_line(tmp_path: Path):
    from growpipe.prepare import read_config

    config = _write(tmp_path / "run.yaml", "method: sgd\ntrain:\n  lr: 0.1\n  epochs: 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(config, ["train.lr=-1"])
    text = str(e.value)
    assert "method (line 1): got 'sgd'" in text and "train.lr (--set train.lr=-1): Input should be greater" in text
    assert "line 3" not in text
    _, problems = read_config(str(config), ["train={lr: inf}"])  # a whole section set: its keys come from --set
    assert problems[1] == ("train.lr (--set train={lr: inf}): got inf; give a finite number (inf and nan are not "
                           "values a run can use)")  # fmt: skip
    assert read_config(None, ["net.width=0"])[1][0].startswith("net.width: ")  # no file: all from --set
