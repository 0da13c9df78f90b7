"""``landscape train`` and ``landscape phases``: the options mirror TrainConfig / PhasesConfig one-to-one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from cli.common import echo_json, echo_table, json_option, parse_json_option, progress_enabled, root_of
from cli.generate import deprecated_values, field_option, old_options
from cli.options import Count, FiniteFloat, Seed, data_options, device_option, model_options, run_api
from landscape.options import hints
from landscape.train.config import OPTIMIZERS, PHASE_FAMILIES, PhasesConfig, TrainConfig

_D = TrainConfig()
_CHUNK = next(f for f in dataclasses.fields(TrainConfig) if f.name == "chunk")
_COLUMNS = ["run", "optimizer", "parent", "step", "epoch", "epsilon", "train_acc", "test_acc", "test_loss",
            "seconds"]


def _training_options(func: Callable) -> Callable:
    """Options shared by ``train`` and ``phases`` (every TrainConfig field but optimizer/run/from/resume)."""
    options = [
        data_options(default=None),
        model_options(default=None),
        click.option("--data-seed", type=Seed(), default=_D.data_seed, show_default=True,
                     help="Seed of the data set (subset draw, synthetic data)."),
        click.option("--epochs", type=Count(min=1), default=_D.epochs, show_default=True,
                     help="Epochs of ceil(N/B) steps each (as `landscape privacy --epochs` counts)."),
        click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=_D.lr, show_default=True, help="Learning rate."),
        click.option("--momentum", type=FiniteFloat(min=0, max=1, max_open=True), default=_D.momentum, show_default=True),
        click.option("--weight-decay", type=FiniteFloat(min=0), default=_D.weight_decay, show_default=True),
        click.option("--batch-size", type=Count(min=1), default=_D.batch_size, show_default=True,
                     help="Batch size B (the expected batch size q*N under Poisson sampling)."),
        click.option("--seed", type=Seed(), default=_D.seed, show_default=True,
                     help="Seeds initialisation, data order and noise."),
        device_option(_D.device),
        click.option("--checkpoint-every", default=_D.checkpoint_every, show_default=True,
                     help="Ns (steps), Ee (epochs) or none; init and final are always kept."),
        click.option("--max-grad-norm", type=FiniteFloat(min=0, min_open=True), default=_D.max_grad_norm, show_default=True,
                     help="Clipping norm C."),
        click.option("--noise-multiplier", type=FiniteFloat(min=0), default=None, help="Noise multiplier sigma."),
        click.option("--target-epsilon", type=FiniteFloat(min=0, min_open=True), default=None,
                     help="Find sigma so that epsilon after training equals this (instead of --noise-multiplier)."),
        click.option("--delta", type=FiniteFloat(min=0, max=1, min_open=True, max_open=True), default=_D.delta, show_default=True),
        click.option("--accountant", type=click.Choice(["rdp", "pld"]), default=_D.accountant, show_default=True),
        click.option("--clip-style", type=click.Choice(["flat", "layerwise"]), default=_D.clip_style,
                     show_default=True),
        click.option("--clip-fn", type=click.Choice(["abadi", "automatic", "normalize", "global"]),
                     default=_D.clip_fn, show_default=True),
        click.option("--sampling", type=click.Choice(["poisson", "shuffle"]), default=None,
                     help="Default: poisson for DP optimizers (what the accountant assumes), shuffle for sgd."),
        click.option("--sparsify", type=FiniteFloat(min=0, max=1, max_open=True), default=_D.sparsify, show_default=True,
                     help="Random sparsification rate R* with gradual cooling (Zhu & Blaschko Alg. 1)."),
        click.option("--smooth", type=FiniteFloat(min=0), default=_D.smooth, show_default=True,
                     help="Laplacian smoothing sigma_LS (DP-LSSGD)."),
        click.option("--chunk", type=Count(min=1), default=None, help=_CHUNK.metadata["help"]),
        *old_options(_CHUNK, int),  # --microbatch, its old name, for one release
    ]
    for option in reversed(options):
        func = option(func)
    for param in func.__click_params__:
        if param.name in ("data", "model"):  # None: lenet/digits from scratch, the parent's with --from
            param.required = False
            param.help = f"{param.help} Default: {'digits' if param.name == 'data' else 'lenet'}, or the parent's with --from."
    return func


def _config_fields(kwargs: dict[str, Any], ctx: click.Context) -> dict[str, Any]:
    """Click keyword arguments -> TrainConfig fields (JSON options parsed; a renamed option's old flag, with its
    deprecation line)."""
    out = dict(kwargs)
    out.update(run_api(lambda: deprecated_values(TrainConfig, out, ctx)))
    out["data_kwargs"] = parse_json_option(out.get("data_kwargs"), "--data-kwargs")
    out["model_kwargs"] = parse_json_option(out.get("model_kwargs"), "--model-kwargs")
    for key in ("name", "subset", "data_root", "download"):
        if key in out["data_kwargs"]:
            raise click.BadParameter(f"{key} cannot go in the JSON; use the matching option", param_hint="--data-kwargs")
    return out


def _rows(summaries: list[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(s) for s in summaries]


@click.command("train")
@_training_options
@click.option("--optimizer", type=click.Choice(list(OPTIMIZERS)), default=_D.optimizer, show_default=True,
              help="sgd, dpsgd (clip + noise), clip-only, noise-only.")
@click.option("--run", "run", default=None, help="Run name (default: a generated unique id).")
@click.option("--from", "from_ref", default=None, metavar="REF",
              help="Start from a checkpoint (RUN[@init|@last|@step=N|@epoch=E] or PATH.h5): a child run.")
@click.option("--resume", default=None, metavar="RUN", help="Continue a killed run from its last checkpoint (from step 0 if it was killed before its first).")
@json_option
@click.pass_context
def train(ctx: click.Context, as_json: bool, **kwargs: Any) -> None:
    """Train a model (SGD or the DP-SGD family) into the checkpoint store."""
    from landscape.api.training import summarize
    from landscape.api.training import train as api_train
    from landscape.errors import UsageError

    if kwargs["resume"] is not None:
        given = [p.opts[0] for p in ctx.command.params
                 if p.name not in ("resume", "data_root", "as_json")
                 and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise UsageError(f"--resume RUN continues with the run's stored options; drop {', '.join(given)}")
    config = TrainConfig(**_config_fields(kwargs, ctx))
    run = run_api(lambda: api_train(config, root=root_of(ctx), progress=progress_enabled()))
    summary = summarize(run)
    if as_json:
        echo_json(dataclasses.asdict(summary))
        return
    echo_table(_rows([summary]), _COLUMNS)
    click.echo(f"run written to {run.path}")


def _phases_option(name: str):
    """The click option of PhasesConfig field ``name``, from its option() metadata."""
    f = next(f for f in dataclasses.fields(PhasesConfig) if f.name == name)
    return field_option(f, hints(PhasesConfig)[name])


def _families(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@click.command("phases")
@_training_options
@click.option("--k", "k", type=Count(min=1), required=True, help="Phase-1 epochs (Watson et al. Sec. 4.1.1).")
@click.option("--copies", type=Count(min=1), default=2, show_default=True,
              help="Phase-2 copies per combination (they differ only in data order and noise).")
@click.option("--phase1", default=",".join(PHASE_FAMILIES), show_default=True, help="Phase-1 families: sgd,dpsgd.")
@click.option("--phase2", default=",".join(PHASE_FAMILIES), show_default=True, help="Phase-2 families: sgd,dpsgd.")
@click.option("--dp-lr", type=FiniteFloat(min=0, min_open=True), default=None, help="Learning rate of DP phases (default: --lr).")
@click.option("--dp-momentum", type=FiniteFloat(min=0, max=1, max_open=True), default=None, help="Momentum of DP phases (default: --momentum).")
@click.option("--group", default=None, help="Name prefix of the runs (default: phases-<hash>).")
@_phases_option("phase2_sgd_lr")
@_phases_option("phase2_sgd_momentum")
@json_option
@click.pass_context
def phases(ctx: click.Context, as_json: bool, k: int, copies: int, phase1: str, phase2: str,
           dp_lr: float | None, dp_momentum: float | None, group: str | None, phase2_sgd_lr: float | None,
           phase2_sgd_momentum: float | None, **kwargs: Any) -> None:
    """Phase 1 / Phase 2 branches: SGD and DP-SGD for k epochs from one init, then each way for the rest."""
    from landscape.api.training import phases as api_phases

    base = TrainConfig(**_config_fields(kwargs, ctx), optimizer="sgd")
    config = PhasesConfig(base=base, k=k, copies=copies, phase1=_families(phase1), phase2=_families(phase2),
                          dp_lr=dp_lr, dp_momentum=dp_momentum, group=group, phase2_sgd_lr=phase2_sgd_lr,
                          phase2_sgd_momentum=phase2_sgd_momentum)
    bars = progress_enabled()  # without bars (output piped): one line per finished run on stderr
    report = None if bars else (lambda line: click.echo(line, err=True))
    summaries = run_api(lambda: api_phases(config, root=root_of(ctx), progress=bars, report=report))
    if as_json:
        echo_json(_rows(summaries))
        return
    echo_table(_rows(summaries), ["run", "phase1", "phase2", "copy", "parent", "epoch", "epsilon", "test_acc",
                                  "test_loss"])
    click.echo(f"{len(summaries)} runs in {root_of(ctx)}")
