"""``landscape.api.figures``: the paper-figure recipes (implemented in :mod:`landscape.figures`)."""

from landscape.figures import figures

__all__ = ["figures"]
