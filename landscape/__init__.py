"""landscape: see why differentially private training ends up worse than SGD.

Train and store SGD / DP-SGD trajectories, then measure the loss-landscape and gradient geometry around
them. The Python face is :mod:`landscape.api`; the ``landscape`` command is a thin layer over it.
"""

__version__ = "0.1.0"
