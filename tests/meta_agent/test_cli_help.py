"""Every `meta-agent` command answers --help and -h with its usage, its main keys and an example, before
Hydra reads the flag as a malformed override; the keys are real and the examples load."""

from __future__ import annotations

import re
import shlex

import pytest
from omegaconf import OmegaConf

from meta_agent.cli import COMMAND_HELP, USAGE, command_help, main
from meta_agent.config import CONFIG_DIR, compose_config, load_config

COMMANDS = ("solve", "eval", "train", "dpo", "sft", "demos", "probe", "report", "config")
GROUPS = ("experiment", "roles")  # Hydra config groups: a folder of configs/, not a key
KEY = re.compile(r"(?<![\w./<>-])([a-z_]\w*(?:\.[\w<>]+)*)=")


def test_the_usage_lists_exactly_the_commands_that_have_help():
    listed = re.findall(r"^  (\w+)", USAGE.split("commands:")[1].split("overrides")[0], re.MULTILINE)
    assert set(listed) == set(COMMANDS) == set(COMMAND_HELP)


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_help(command, flag, capsys):
    assert main([command, flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: meta-agent {command}")
    assert "\nexample:\n  meta-agent " + command in out
    if command != "report":  # report takes a folder, not keys
        assert "main keys" in out
        assert main([command, "experiment=arith_hierarchy", flag]) == 0  # the flag after settings too
        assert capsys.readouterr().out == out
    assert main(["help", command]) == 0 and capsys.readouterr().out == out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_real_keys_and_its_example_loads(command):
    text = command_help(command)
    composed = compose_config([])
    for key in KEY.findall(text.split("\n", 1)[1].replace("key=value", "")):  # not the usage line
        if key in GROUPS:
            assert (CONFIG_DIR / key).is_dir()
            continue
        value = OmegaConf.select(composed, key.replace("<role>", "executor"), default=KeyError)
        assert value is not KeyError, f"meta-agent {command} --help names {key}=, not a setting"
    for name in re.findall(r"roles=NAME.*?: (\w+(?: \| \w+)*)", text):
        assert {n.strip() for n in name.split("|")} <= {p.stem for p in (CONFIG_DIR / "roles").glob("*.yaml")}
    example = text.split("example:\n")[1].strip().splitlines()[0]
    args = shlex.split(example)[2:]
    overrides = [a for a in args if KEY.match(a)]
    assert all(KEY.match(a) or a == args[0] for a in args), example  # only a question or folder is not a key
    load_config(overrides + (["train.algorithm=dpo"] if command == "dpo" else []))
