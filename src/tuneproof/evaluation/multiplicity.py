"""Multiple-testing corrections for a family of per-class tests (one hypothesis per class).

A per-class guard over 77 classes tests 77 hypotheses: at 5% each, about four classes "fail" by
chance alone when nothing moved. Two corrections, on the per-class p-values:

- Holm (1979), "A simple sequentially rejective multiple test procedure", *Scandinavian Journal
  of Statistics* 6:65-70: controls the family-wise error rate (the chance of at least one false
  rejection) at ``alpha`` under any dependence. Sort the m p-values ascending; reject
  p_(1)..p_(k-1) where k is the first rank with p_(k) > alpha / (m - k + 1). Adjusted p-value:
  p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)). The guard's pass/fail decision uses it.
- Benjamini & Hochberg (1995), "Controlling the false discovery rate", *JRSS B* 57:289-300:
  controls the expected share of false rejections among the rejections ("which classes moved").
  Reject p_(1)..p_(k) for the largest k with p_(k) <= k alpha / m. Adjusted value (q-value):
  q_(i) = min_{j >= i} min(1, m p_(j) / j).

Both equal ``statsmodels.stats.multitest.multipletests`` with ``method="holm"`` / ``"fdr_bh"``
(not a dependency here); a p-value is rejected exactly when its adjusted value is <= alpha.
"""

from __future__ import annotations

from collections.abc import Sequence

ALPHA = 0.05  # family-wise error rate (Holm) and false discovery rate (BH) of the per-class family


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> tuple[list[float], list[bool]]:
    """Holm's step-down adjusted p-values and rejections, in the input order.

    Args:
        pvalues: m p-values in [0, 1].
        alpha: the family-wise error rate.

    Returns:
        ``(adjusted, rejected)``, two lists of length m; ``rejected[i]`` is ``adjusted[i] <= alpha``.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):  # rank 0 is the smallest p-value, multiplied by m
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted, [a <= alpha + 1e-15 for a in adjusted]


def benjamini_hochberg(pvalues: Sequence[float], alpha: float = ALPHA) -> tuple[list[float], list[bool]]:
    """Benjamini-Hochberg step-up adjusted p-values (q-values) and rejections, in the input order.

    Args:
        pvalues: m p-values in [0, 1].
        alpha: the false discovery rate.

    Returns:
        ``(q_values, rejected)``, two lists of length m; ``rejected[i]`` is ``q_values[i] <= alpha``.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 1.0
    for rank in range(m - 1, -1, -1):  # from the largest p-value down, rank + 1 is its 1-based rank
        i = order[rank]
        running = min(running, min(1.0, m * float(pvalues[i]) / (rank + 1)))
        adjusted[i] = running
    return adjusted, [a <= alpha + 1e-15 for a in adjusted]
