"""Entry point of the ``landscape`` command.

Commands live one group per module under ``cli/`` and are loaded lazily (so ``landscape --help`` does not
import torch-heavy analyzers it does not need). Every job kind of the registry :mod:`landscape.kinds` is a
command generated from its spec: an analysis' by :mod:`cli.generate`, every other kind's by :mod:`cli.kinds`. A
command that is no job kind is one module plus one line in ``COMMANDS``. Every :class:`~landscape.errors.LandscapeError` becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import contextvars
import importlib
import os
import sys

import click

from landscape import __version__
from landscape.bounds import COUNT_MAX

# command name -> ("module:attribute" of a click command or group, one-line help shown by --help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("cli.demo:demo", "The main job end to end on digits: phases, instabilities, directions, figures."),
    "store": ("cli.store:store", "List runs and inspect checkpoints in the store."),
    "show": ("cli.show:show", "Print any result file (kind, inputs, options, attrs, arrays)."),
    "privacy": ("cli.privacy:privacy", "Epsilon of a DP-SGD schedule, or the noise multiplier for a target epsilon."),
    "batch": ("cli.batch:batch", "Run a YAML sweep of train/phases/prune/analysis jobs, in-process or on Dask."),
}

def _help(name: str) -> str:
    from landscape import kinds

    return COMMANDS[name][1] if name in COMMANDS else kinds.summary(name)


def _load(where: str) -> click.Command:
    module, attr = where.split(":")
    return getattr(importlib.import_module(module), attr)


class LazyGroup(click.Group):
    """The commands of ``COMMANDS`` plus one per job kind (:mod:`landscape.kinds`), generated from its spec, each
    imported only when it runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        from landscape import kinds

        return sorted(set(COMMANDS) | set(kinds.names()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMANDS:
            return _load(COMMANDS[name][0])
        from landscape import kinds

        if name not in kinds.names():
            return None
        if kinds.is_analysis(name):
            from cli.generate import command

            return command(name)
        from cli.kinds import command

        return command(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # List commands from the registries' help strings so `--help` imports no command or analyzer module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, _help(name)) for name in self.list_commands(ctx)])


@click.group(cls=LazyGroup, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="landscape")
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    envvar="LANDSCAPE_ROOT",
    default="checkpoints",
    show_default=True,
    help="Checkpoint store root (env LANDSCAPE_ROOT).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1, max=COUNT_MAX),
    envvar="LANDSCAPE_THREADS",
    default=None,
    help="torch intra-op threads (env LANDSCAPE_THREADS; default: torch's).",
)
@click.option(
    "--code",
    "code",
    multiple=True,
    metavar="REF",
    help="Model / data code (module:factory or file.py:factory) that stored checkpoints name and may run to "
         "rebuild them; repeatable. Nothing else a store names is ever imported.",
)
@click.option("--accept-changed-code", is_flag=True,
              help="Rebuild with --code whose source changed since it was recorded (the result records it).")
@click.pass_context
def cli(ctx: click.Context, root: str, threads: int | None, code: tuple[str, ...], accept_changed_code: bool) -> None:
    """See why DP-SGD ends up worse than SGD: train, store and measure loss-landscape geometry."""
    from landscape.runtime import set_threads

    set_threads(threads)
    if code or accept_changed_code:
        from landscape import plugins

        plugins.trust(code, accept_changed=accept_changed_code)
    ctx.obj = {"root": root}


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; turn LandscapeError into one line on stderr with its exit code."""
    from landscape.errors import LandscapeError

    try:
        # in a copy of the context: what the command trusts (--code) ends with it, also when called in-process
        contextvars.copy_context().run(cli.main, args=argv, prog_name="landscape", standalone_mode=False)
    except click.exceptions.Abort:  # click's form of Ctrl-C
        click.echo("interrupted", err=True)
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
    except LandscapeError as exc:
        click.echo(f"error: {' '.join(str(exc).splitlines())}", err=True)  # one line even if a message has two
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
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
