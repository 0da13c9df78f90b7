"""`landscape ntk` and `landscape ntk-table`: the empirical NTK under clipping (Bu et al. 2023).

Options mirror :class:`landscape.analyze.ntk.NTKConfig` / :class:`NTKTableConfig` one to one; the commands
call :mod:`landscape.api.kernels` and print a short table (``--json``: the same as JSON).
"""

from __future__ import annotations

import click

from cli.common import echo_json, echo_table, json_option, root_of
from cli.options import (
    CommaList,
    FiniteFloat,
    add_options,
    data_root_option,
    no_figure_option,
    output_option,
    run_api,
)

KINDS = ["loss-grad", "output", "output-trace"]
CLIP_FNS = ["abadi", "automatic", "normalize", "global"]


def _common(f):
    options = [
        click.option("--n", type=click.IntRange(min=1), default=128, show_default=True,
                     help="Number of examples (seeded stratified subset of the checkpoint's data)."),
        click.option("--kind", type=click.Choice(KINDS), default="loss-grad", show_default=True,
                     help="loss-grad: <grad l_i, grad l_j>; output: d f/d w (d f/d w)^T (nM x nM); "
                          "output-trace: its trace over logits (n x n)."),
        click.option("--clip-fn", type=click.Choice(CLIP_FNS), default="abadi", show_default=True,
                     help="Clipping function (Bu et al. Sec. 2.2)."),
        click.option("--layers", type=CommaList(), default=None,
                     help="Glob patterns of parameter names to include (default: all trainable)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the example subset."),
        click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True),
        click.option("--max-memory", default="4GB", show_default=True,
                     help="Memory budget of the Gram computation (e.g. 4GB, 512MiB)."),
        click.option("--strategy", type=click.Choice(["auto", "hooks", "materialize", "ghost", "functorch"]),
                     default="auto", show_default=True, help="How per-layer Gram blocks are computed."),
        click.option("--precision", type=click.Choice(["auto", "double", "single"]), default="auto",
                     show_default=True,
                     help="auto: float64 for small tensors, model dtype for big contractions; double: model in float64."),
        data_root_option,
        no_figure_option,
        output_option,
        json_option,
    ]
    return add_options(options, f)


def _yn(flag: bool) -> str:
    return "yes" if flag else "NO"


@click.command()
@click.argument("ref")
@click.option("--clip", type=click.Choice(["none", "flat", "layerwise"]), default="none", show_default=True,
              help="Kernel: K (none), K C (flat), sum_r K_r C_r (layerwise).")
@click.option("--max-grad-norm", "-C", type=FiniteFloat(min=0, min_open=True), default=1.0, show_default=True,
              help="Clipping norm C.")
@click.option("--layer-max-norm", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Layerwise per-layer norm C_r (default C / sqrt(#layers), as in training).")
@_common
@click.pass_context
def ntk(ctx, ref, clip, max_grad_norm, layer_max_norm, n, kind, clip_fn, layers, seed, split, max_memory,
        strategy, precision, data_root, no_figure, output, as_json) -> None:
    """Empirical NTK at checkpoint REF, with or without clipping: symmetry, positivity, spectra.

    REF is PATH.h5 or RUN@init|@last|@step=N|@epoch=E.
    """
    from landscape.analyze.ntk import NTKConfig
    from landscape.api.kernels import ntk as run_ntk

    config = NTKConfig(n=n, kind=kind, clip=clip, max_grad_norm=max_grad_norm, clip_fn=clip_fn, layers=layers,
                       layer_max_norms=layer_max_norm, seed=seed, split=split, max_memory=max_memory,
                       strategy=strategy, precision=precision)
    out = run_api(lambda: run_ntk(ref, config, root=root_of(ctx), output=output, figure=not no_figure,
                                  data_root=data_root))
    r = out.result
    if as_json:
        echo_json({"output": str(out.output), "figures": [str(f) for f in out.figures], **r.summary()})
        return
    rows = []
    for label, p, frac in (("K", r.K_properties, 0.0), (f"A ({clip})", r.properties, r.fraction_clipped)):
        if label == "K" or clip != "none":
            rows.append({"kernel": label, "size": p.n, "clipped": frac, "symmetric": _yn(p.symmetric),
                         "asymmetry": p.asymmetry, "pos_quad": _yn(p.positive_quadratic),
                         "min_sym_eig": p.min_sym_eig, "pos_eig": _yn(p.positive_eigenvalues),
                         "min_re_eig": p.min_real_eig, "max_|im|": p.max_abs_imag_eig, "norm": p.norm})
    echo_table(rows)
    click.echo(f"wrote {out.output}" + (f" and {len(out.figures)} figure files" if out.figures else ""))


@click.command("ntk-table")
@click.argument("target")
@click.option("--max-grad-norm", "-C", "max_grad_norms", type=CommaList(number=True),
              default="0.01,0.1,1,10,100", show_default=True, help="Clipping norms C.")
@click.option("--clip-style", "clip_styles", type=CommaList(), default="flat,layerwise", show_default=True,
              help="Clipping styles: flat, layerwise.")
@_common
@click.pass_context
def ntk_table(ctx, target, max_grad_norms, clip_styles, n, kind, clip_fn, layers, seed, split, max_memory,
              strategy, precision, data_root, no_figure, output, as_json) -> None:
    """Bu et al. Table 1 measured at TARGET: for each clipping norm and style, is the kernel symmetric,
    positive in quadratic form, positive in eigenvalues (with the numbers behind each answer).

    TARGET is a checkpoint (PATH.h5, RUN@last, ...) or a run name, meaning every checkpoint of the run.
    Writes HDF5 + CSV + figure.
    """
    from landscape.analyze.ntk import NTKTableConfig
    from landscape.api.kernels import ntk_table as run_table

    config = NTKTableConfig(max_grad_norms=max_grad_norms, clip_styles=clip_styles, n=n, kind=kind,
                            clip_fn=clip_fn, layers=layers, seed=seed, split=split, max_memory=max_memory,
                            strategy=strategy, precision=precision)
    out = run_api(lambda: run_table(target, config, root=root_of(ctx), output=output, figure=not no_figure,
                                    data_root=data_root))
    rows = [
        {"step": r.step, "epoch": r.epoch, "C": None if r.style == "none" else r.max_grad_norm, "style": r.style,
         "clipped": r.fraction_clipped, "symmetric": _yn(r.symmetric), "asymmetry": r.asymmetry,
         "pos_quad": _yn(r.positive_quadratic), "min_sym_eig": r.min_sym_eig,
         "pos_eig": _yn(r.positive_eigenvalues), "min_re_eig": r.min_real_eig, "max_|im|": r.max_abs_imag_eig}
        for r in out.table.rows
    ]
    if as_json:
        echo_json({"output": str(out.output), "csv": str(out.csv), "figures": [str(f) for f in out.figures],
                   "rows": [vars(r) for r in out.table.rows]})
        return
    echo_table(rows)
    click.echo(f"wrote {out.output}, {out.csv}" + (f" and {len(out.figures)} figure files" if out.figures else ""))
