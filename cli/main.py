"""Entry point of the ``landscape`` command: every job kind of :mod:`landscape.kinds` is a command generated
from its spec, the others are ``COMMANDS``; all load lazily, so ``--help`` imports no torch. Every
:class:`~landscape.errors.LandscapeError` becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import contextvars
import importlib
import os
import shlex
import sys

import click

from landscape import __version__
from landscape.bounds import COUNT_MAX
from landscape.progress import INTERVAL, INTERVAL_ENV

# command name -> ("module:attribute" of a click command or group, one-line help shown by --help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("cli.demo:demo", "The main job end to end on digits: phases, instabilities, directions, figures."),
    "store": ("cli.store:store", "List runs and inspect checkpoints in the store."),
    "show": ("cli.show:show", "Print any result file (kind, inputs, options, attrs, arrays)."),
    "privacy": ("cli.privacy:privacy", "Epsilon of a DP-SGD schedule, or the noise multiplier for a target epsilon."),
    "batch": ("cli.batch:batch", "Run a YAML sweep of train/phases/prune/analysis jobs, in-process or on Dask."),
}


class LazyGroup(click.Group):
    """The commands of ``COMMANDS`` plus one per job kind (:mod:`landscape.kinds`), generated from its spec, each
    imported only when it runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        from landscape import kinds

        return sorted(set(COMMANDS) | set(kinds.names()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMANDS:
            module, attr = COMMANDS[name][0].split(":")
            return getattr(importlib.import_module(module), attr)
        from landscape import kinds

        if name not in kinds.names():
            return None
        if kinds.is_analysis(name):
            from cli.generate import command

            return command(name)
        from cli.kinds import command

        return command(name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:  # click suggests close names (difflib) from the possibilities
            raise click.exceptions.NoSuchCommand(exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # List commands from the registries' help strings so `--help` imports no command or analyzer module.
        from landscape import kinds

        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1] if name in COMMANDS else kinds.summary(name))
                                for name in self.list_commands(ctx)])


@click.group(cls=LazyGroup, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="landscape")
@click.option("--root", type=click.Path(file_okay=False), envvar="LANDSCAPE_ROOT", default="checkpoints",
              show_default=True, help="Checkpoint store root (env LANDSCAPE_ROOT).")
@click.option("--threads", type=click.IntRange(min=1, max=COUNT_MAX), envvar="LANDSCAPE_THREADS",
              default=None, help="torch intra-op threads (env LANDSCAPE_THREADS; default: torch's).")
@click.option("--code", "code", multiple=True, metavar="REF",
              help="Model / data code (module:factory or file.py:factory) that stored checkpoints name and "
                   "may run to rebuild them; repeatable. Nothing else a store names is ever imported.")
@click.option("--accept-changed-code", is_flag=True,
              help="Rebuild with --code whose source changed since it was recorded (the result records it).")
@click.option("--portable", is_flag=True, envvar="LANDSCAPE_PORTABLE",
              help="Bit-identical results on every x86-64 CPU: kernels any CPU runs alike, one thread, CPU only; "
                   "slower (env LANDSCAPE_PORTABLE=1; see docs/reproducibility.md).")
@click.option("--quiet", "-q", is_flag=True,
              help="No progress on stderr (else: bars on a terminal; piped or redirected, one line every "
                   f"{INTERVAL:g} s with what, how far and the ETA; env {INTERVAL_ENV} sets the seconds).")
@click.pass_context
def cli(ctx: click.Context, root: str, threads: int | None, code: tuple[str, ...], accept_changed_code: bool,
        portable: bool, quiet: bool) -> None:
    """See why DP-SGD ends up worse than SGD: train, store and measure loss-landscape geometry."""
    from landscape import progress
    from landscape.runtime import set_threads, use_portable

    if portable:  # already in effect: main() (--portable) or `import landscape` ($LANDSCAPE_PORTABLE) chose it
        if threads not in (None, 1):
            raise click.UsageError(f"--portable runs one thread (--threads {threads} given)")
        use_portable()
    set_threads(threads)
    if not quiet:  # for this command only
        ctx.with_resource(progress.enabled())
    ctx.ensure_object(dict).update(root=root, command=ctx.invoked_subcommand)
    if code or accept_changed_code:
        from landscape import plugins

        plugins.trust(code, accept_changed=accept_changed_code)


#: Commands that continue where an interrupted run of theirs stopped when given again as they were (finished
#: runs, recipes, jobs, pairs and surface rows are kept and reused).
RESUMED_BY_RERUN = ("batch", "demo", "figures", "instability", "phases", "surface")


def interrupted(argv: list[str], command: str | None, exc: BaseException | None) -> str:
    """The line for Ctrl-C: ``interrupted``, and the exact command that continues the work where there is one: the
    same command again for :data:`RESUMED_BY_RERUN`, else what the interrupted code attached as a note (a training
    run's ``train --resume``)."""
    if command in RESUMED_BY_RERUN and "--restart" not in argv:
        return f"interrupted; continue where it stopped with the same command: {shlex.join(['landscape', *argv])}"
    notes = [n for n in getattr(exc, "__notes__", ()) if n.startswith("continue it with: ")]
    return f"interrupted; {notes[-1]}" if notes else "interrupted"


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; turn LandscapeError into one line on stderr with its exit code."""
    from landscape.errors import LandscapeError

    argv = list(sys.argv[1:] if argv is None else argv)
    state: dict = {}  # the global options' values and the command's name, as the group's callback saw them
    try:
        if "--portable" in argv:  # before click loads the command's module, which may load torch or numpy
            from landscape.runtime import use_portable

            use_portable()
        # in a copy of the context: what the command trusts (--code) and its progress display end with it, also
        # when called in-process
        contextvars.copy_context().run(cli.main, args=argv, prog_name="landscape", standalone_mode=False, obj=state)
    except click.exceptions.Abort as exc:  # click's form of Ctrl-C
        click.echo(interrupted(argv, state.get("command"), exc.__cause__), err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as exc:  # `landscape`, `landscape store`: asking for the help
        click.echo(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
        sys.exit(0)
    except click.UsageError as exc:  # one line, like every other error (not click's Usage / Try / Error block)
        message = " ".join(exc.format_message().split())
        sub = exc.ctx.command_path.partition(" ")[2] if exc.ctx is not None else ""
        click.echo(f"error: {message} (see 'landscape {sub + ' ' if sub else ''}--help')", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(exc.exit_code)
    except LandscapeError as exc:  # one line even if a message has two; parameters named by their flags
        from cli.common import error_line

        command = cli.get_command(click.Context(cli), state["command"]) if state.get("command") else None
        click.echo(f"error: {error_line(exc, command, cli)}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        click.echo(interrupted(argv, state.get("command"), exc), err=True)
        sys.exit(130)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as exc:  # one line naming the file (cli.common.os_error_line), never a traceback
        from cli.common import os_error_line

        line, code = os_error_line(exc)
        click.echo(f"error: {line}", err=True)
        sys.exit(code)
    sys.exit(0)


if __name__ == "__main__":
    main()
