"""Parameter points the evaluator visits: :class:`Segment` (``lerp(a, b, alpha)``), :class:`Affine`
(``origin + coords @ directions``) and a plain list; structured points expose the generators the shared
first layer mixes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from landscape.errors import UsageError
from landscape.params import lerp_tensor


@dataclass(frozen=True)
class Segment:
    """Points ``lerp_tensor(a, b, alpha)`` (exact ends) for each ``alpha`` (Watson et al. Sec. 2.2: ``(1-a) A + a B``)."""

    a: torch.Tensor
    b: torch.Tensor
    alphas: torch.Tensor

    def __len__(self) -> int:
        return int(self.alphas.numel())

    @property
    def dim(self) -> int:
        return int(self.a.numel())

    def point(self, i: int) -> torch.Tensor:
        return lerp_tensor(self.a, self.b, float(self.alphas[i]))

    def generators(self) -> list[torch.Tensor]:
        return [self.a, self.b]

    def mix(self, outputs: Sequence[torch.Tensor], i: int) -> torch.Tensor:
        return lerp_tensor(outputs[0], outputs[1], float(self.alphas[i]))


@dataclass(frozen=True)
class Affine:
    """Points ``origin + sum_j coords[p, j] * directions[j]`` (random directions and surfaces); zero coordinates
    are skipped, so a point on a ray or grid line costs one vector add, not ``k``."""

    origin: torch.Tensor
    directions: torch.Tensor  # (k, d)
    coords: torch.Tensor  # (P, k)

    def __post_init__(self) -> None:
        terms: list[list[tuple[int, float]]] = [[] for _ in range(len(self))]
        nz = torch.nonzero(self.coords)
        for (p, j), c in zip(nz.tolist(), self.coords[nz[:, 0], nz[:, 1]].tolist(), strict=True):
            terms[p].append((j, c))
        object.__setattr__(self, "_terms", terms)  # per point: (direction index, coordinate) where non-zero

    def __len__(self) -> int:
        return int(self.coords.shape[0])

    @property
    def dim(self) -> int:
        return int(self.origin.numel())

    def point(self, i: int) -> torch.Tensor:
        return _combine(self.origin, self.directions, self._terms[i])

    def generators(self) -> list[torch.Tensor]:
        return [self.origin, *self.directions.unbind(0)]

    def mix(self, outputs: Sequence[torch.Tensor], i: int) -> torch.Tensor:
        return _combine(outputs[0], outputs[1:], self._terms[i])


def _combine(base: torch.Tensor, vectors, terms: Sequence[tuple[int, float]]) -> torch.Tensor:
    """``base + sum c * vectors[j]`` over ``terms`` (a new tensor; ``base`` is not changed)."""
    if not terms:
        return base.clone()
    (j, c), rest = terms[0], terms[1:]
    out = torch.add(base, vectors[j], alpha=c)
    for j, c in rest:
        out.add_(vectors[j], alpha=c)
    return out


class _Listed:
    """Unstructured points: a (P, d) tensor or a list of flat vectors."""

    def __init__(self, points: torch.Tensor | Iterable[torch.Tensor]):
        if isinstance(points, torch.Tensor):
            if points.dim() == 1:
                points = points.unsqueeze(0)
            if points.dim() != 2:
                raise UsageError(f"points must be a (P, d) tensor, got shape {tuple(points.shape)}")
            self.rows = list(points.unbind(0))
        else:
            self.rows = [p.reshape(-1) for p in points]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def dim(self) -> int:
        return int(self.rows[0].numel()) if self.rows else 0

    def point(self, i: int) -> torch.Tensor:
        return self.rows[i]
