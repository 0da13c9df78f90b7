"""The stated limits of the numbers a user gives, in one place for the command line, the api and batch specs
(seeds in ``[0, SEED_MAX]``: numpy refuses negative seeds, torch takes 64 bits). Imports nothing heavy.
"""

from __future__ import annotations

import math
from typing import Any

from landscape.errors import OptionError

SEED_MAX = 2**63 - 1
COUNT_MAX = 2**31 - 1
POINTS_MAX = 10_000
BINS_MAX = 10_000
GRID_CELLS_MAX = 1_000_000
DIRECTIONS_MAX = 10_000  # random directions of ``directions --directions``: all are held in memory at once
LANCZOS_STEPS_MAX = 10_000  # ``hessian --lanczos-steps``: a (steps, parameters) basis is held at once
CLASSES_MAX = 100_000  # classes of a data set (ImageNet-21k has 21,841): the output layer is allocated up front
SCHEDULER_TIMEOUT_S = 10  # how long a command waits for the Dask scheduler it names (``--scheduler``)


def is_seed(name: str) -> bool:
    """Whether an option named ``name`` (``seed``, ``subset_seed``, ``--data-seed``) is a seed."""
    name = name.lstrip("-").replace("-", "_")
    return name == "seed" or name.endswith("_seed")


def int_or_float(text: str) -> int | float:
    """``"300"`` as an int, ``"0.3"`` or ``"1e3"`` as a float; ValueError for anything else."""
    try:
        return int(text.strip())
    except ValueError:
        return float(text.strip())


def subset_value(value: Any, name: str = "subset") -> int | float | None:
    """A subset as a count (an integer ``>= 1``, ``"300"``) or a fraction (a float in ``(0, 1]``, ``"0.3"``);
    None stays None. The one rule of every command, the api and batch specs."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise OptionError(name, f"must be a count or a fraction, got {value!r}")
    try:
        number = value if isinstance(value, (int, float)) else int_or_float(str(value))
    except ValueError:
        raise OptionError(name, f"must be a count or a fraction, got {value!r}") from None
    if isinstance(number, int):
        if not 1 <= number <= COUNT_MAX:
            raise OptionError(name, f"must be a count in [1, {COUNT_MAX}], got {number}")
        return number
    if not (math.isfinite(number) and 0.0 < number <= 1.0):
        raise OptionError(name, f"must be a fraction in (0, 1], got {number} (a count is an integer)")
    return float(number)


def scheduler_note(address: str) -> str:
    """The line a command prints on stderr before it waits for a Dask scheduler."""
    return f"dask: connecting to the scheduler at {address} (waiting up to {SCHEDULER_TIMEOUT_S} s)"
