"""One vocabulary over every command (docs/commands.md: one name, one meaning): read from each command's options
as ``--help`` shows them, so a new option that drifts from the others fails here."""

from __future__ import annotations

import collections
import re

import click
import pytest

from cli.main import cli

#: Flags whose type differs between commands on purpose: flag -> why.
TYPES_DIFFER = {
    "--split": "analyses that evaluate both splits take a comma list (train,test); the others one split",
    "--clip-style": "ntk also has the unclipped kernel (none)",
    "--precision": "ntk also chooses per tensor (auto)",
    "--k": "demo makes one family per Phase-1 length (a comma list); phases makes one",
}
#: Flags whose default differs between commands on purpose: flag -> why.
DEFAULTS_DIFFER = {
    "--split": "each analysis' natural split",
    "--clip-style": "ntk's default kernel is the unclipped one",
    "--precision": "ntk's auto is exact for the small tensors the Hessian products do not single out",
    "--k": "demo's families",
    "--subset": "all examples for evaluations; a budget where the cost grows faster than the examples",
    "--chunk": "1000 for a forward pass, 250 for per-sample gradients, all at once for training",
    "--batch-size": "training's B, clipping's B (the paper's 256), privacy's (required)",
    "--epochs": "demo's and train's sizes; privacy's (required)",
    "--bins": "norms' histograms and calibration's confidence bins",
    "--directions": "demo's smaller set",
    "--copies": "demo's verdicts need three siblings",
    "--target-epsilon": "demo trains at epsilon 8",
    "--delta": "import declares it with --epsilon (no default)",
    "--normalize": "Watson's isotropic directions; Li et al.'s filter-normalised plane",
    "--accountant": "a child run continues with its parent's (no fixed default)",
    "--out": "each command's own folder",
    "--run": "prune needs one",
    "--data": "import needs one",
    "--model": "import needs one",
    "--data-kwargs": "import takes none by default",
    "--model-kwargs": "import takes none by default",
}
#: The only short flags: the output file and the help.
SHORT_FLAGS = {"-o", "-h"}
#: Options whose help text is the same wherever they appear (their meaning is).
SAME_HELP = ("--chunk", "--subset-seed", "--clip-fn", "--data-root")
#: Commands that compute on a device.
DEVICE_COMMANDS = {"train", "phases", "demo", "figures", "interpolate", "instability", "ntk", "ntk-table",
                   "clipping", "symmetry", "norms", "directions", "surface", "calibration", "hessian"}


def _commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    out = {}

    def walk(cmd: click.Command, path: str) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), f"{path} {name}".strip())
        else:
            out[path] = cmd

    walk(cli, "")
    return out


COMMANDS = _commands()


def _options() -> dict[str, list[tuple[str, click.Option]]]:
    by_flag = collections.defaultdict(list)
    for name, cmd in COMMANDS.items():
        for p in cmd.params:
            if isinstance(p, click.Option):
                for flag in p.opts + p.secondary_opts:
                    by_flag[flag].append((name, p))
    return by_flag


OPTIONS = _options()


def _type(p: click.Option) -> str:
    return "flag" if p.is_flag else p.make_metavar(click.Context(cli)) if p.metavar is None else p.metavar


@pytest.mark.parametrize("flag", sorted(f for f, uses in OPTIONS.items() if len(uses) > 1))
def test_one_name_one_type_and_default(flag):
    uses = OPTIONS[flag]
    types = {_type(p) for _, p in uses}
    defaults = {repr(p.default) for _, p in uses if not p.is_flag}
    if flag not in TYPES_DIFFER:
        assert len(types) == 1, f"{flag}: {[(n, _type(p)) for n, p in uses]}"
    if flag not in DEFAULTS_DIFFER:
        assert len(defaults) <= 1, f"{flag}: {[(n, p.default) for n, p in uses]}"


def test_the_exceptions_are_still_needed():
    for table in (TYPES_DIFFER, DEFAULTS_DIFFER):
        for flag in table:
            assert len(OPTIONS.get(flag, ())) > 1, f"{flag} is no longer shared: drop it from the table"


def test_no_aliases_and_no_hidden_options():
    for flag, uses in OPTIONS.items():
        for name, p in uses:
            assert not p.hidden, f"{name} {flag} is hidden"
            assert flag.startswith("--") or flag in SHORT_FLAGS, f"{name}: short flag {flag}"
            assert len([o for o in p.opts if o.startswith("--")]) == 1, f"{name}: {p.opts} name one option twice"


def test_seeds_subsets_and_devices_mean_one_thing():
    for flag, uses in OPTIONS.items():
        for name, p in uses:
            if flag.endswith("seed"):
                assert _type(p) == "SEED", f"{name} {flag}"
            if flag == "--seed":  # the examples are --subset-seed's
                assert "subset" not in (p.help or "") and "example" not in (p.help or ""), f"{name}: {p.help}"
    assert {n for n, p in OPTIONS["--subset"]} >= {"hessian", "ntk", "ntk-table", "norms", "symmetry", "interpolate"}
    assert {_type(p) for _, p in OPTIONS["--subset"]} == {"N|FRACTION"}
    drawn = {n for n, _ in OPTIONS["--subset"]} - {"train", "phases", "import"}  # those train on --data-seed's
    assert drawn == {n for n, _ in OPTIONS["--subset-seed"]}
    assert {n for n, _ in OPTIONS["--device"]} == DEVICE_COMMANDS


@pytest.mark.parametrize("flag", SAME_HELP)
def test_one_meaning_one_help(flag):
    helps = {" ".join((p.help or "").split()) for _, p in OPTIONS[flag]}
    assert len(helps) == 1, f"{flag}: {helps}"


_FLAG = re.compile(r"(?<![\w`-])(--[a-z][a-z0-9-]*)")
_OTHER_COMMAND = re.compile(r"`landscape [^`]*`")
GLOBAL = {"--root", "--threads", "--code", "--accept-changed-code", "--help", "--version"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_names_only_its_own_options(name):
    """A flag named in a command's help is one of its options (another command's is quoted with its command)."""
    cmd = COMMANDS[name]
    own = {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts} | GLOBAL
    texts = [cmd.help or ""] + [p.help or "" for p in cmd.params if isinstance(p, click.Option)]
    named = {m for t in texts for m in _FLAG.findall(_OTHER_COMMAND.sub("", t))}
    assert named <= own, f"{name} --help names {sorted(named - own)}"
