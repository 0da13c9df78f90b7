"""The ``landscape`` command: a thin click layer over :mod:`landscape.api`."""
