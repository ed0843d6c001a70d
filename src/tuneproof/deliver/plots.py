"""The dossier's plots, drawn with matplotlib (Agg backend, no display) and returned as PNG bytes.

Each function takes plain numbers (no registry access) and returns ``bytes`` of one PNG image, or
None when there is nothing to draw. Labels may come from the user's data; matplotlib draws them
as text in the image (mathtext is turned off, so a ``$`` in a class name is drawn as is).
"""

from __future__ import annotations

import io
import json
from typing import Any

DPI = 80


def _plt():
    import matplotlib  # noqa: PLC0415 - matplotlib loads only when _plt() runs

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib.pyplot loads only when _plt() runs

    plt.rcParams.update({"text.usetex": False, "axes.titlesize": 11, "font.size": 9, "svg.fonttype": "none"})
    return plt


#: PNG text chunk holding the axis labels of every plot panel (JSON ``[[xlabel, ylabel], ...]``)
AXIS_LABELS_KEY = "tuneproof-axis-labels"


def axis_labels(fig) -> list[list[str]]:
    """``[[xlabel, ylabel], ...]`` of each plot panel of ``fig`` (colour bars are not panels)."""
    return [[ax.get_xlabel(), ax.get_ylabel()] for ax in fig.axes if ax.get_label() != "<colorbar>"]


def _png(fig) -> bytes:
    """The figure as PNG; its panels' axis labels are stored in the text chunk :data:`AXIS_LABELS_KEY`
    (what the dossier tests read back to check that every plot has axis labels)."""
    plt = _plt()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None, AXIS_LABELS_KEY: json.dumps(axis_labels(fig))})
    plt.close(fig)
    return buf.getvalue()


def _safe(text: Any, limit: int = 40) -> str:
    """A label drawn literally: mathtext off ('$' escaped), cut to ``limit`` characters."""
    s = str(text).replace("$", r"\$").replace("\n", " ")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def loss_curves(series: dict[str, list[tuple[int, float]]]) -> bytes | None:
    """Training loss per optimizer step, one line per run (``{run id: [(step, loss)]}``)."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for run, pts in series.items():
        pts = sorted(pts)
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker="o" if len(pts) < 30 else None,
            markersize=3,
            label=_safe(run),
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (per supervised token)")
    ax.set_title("training loss per run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def metric_bars(
    names: list[str],
    base: list[float | None],
    cand: list[float | None],
    *,
    metric: str,
    title: str,
    base_label: str = "baseline",
    cand_label: str = "candidate",
    what: str = "class",
) -> bytes | None:
    """Horizontal bars of ``metric`` per class or field (``what``, the y-axis label), baseline next to candidate."""
    if not names:
        return None
    plt = _plt()
    n = len(names)
    fig, ax = plt.subplots(figsize=(7, max(2.2, 0.28 * n + 1.2)))
    y = list(range(n))
    h = 0.4
    ax.barh([i - h / 2 for i in y], [b or 0.0 for b in base], height=h, label=_safe(base_label), color="#9aa5b1")
    ax.barh([i + h / 2 for i in y], [c or 0.0 for c in cand], height=h, label=_safe(cand_label), color="#2f6fb3")
    ax.set_yticks(y)
    ax.set_yticklabels([_safe(x, 28) for x in names], fontsize=8 if n < 30 else 6)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.0)
    ax.set_xlabel(metric)
    ax.set_ylabel(what)
    ax.set_title(_safe(title, 80))
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _png(fig)


def confusion(matrix: list[list[int]], rows: list[str], cols: list[str], *, title: str) -> bytes | None:
    """A confusion matrix (rows: true class, columns: predicted class), counts written in the cells
    when there are at most 15 classes."""
    if not matrix or not rows:
        return None
    plt = _plt()
    n, m = len(rows), len(cols)
    size = min(9, max(3.2, 0.35 * max(n, m) + 2))
    fig, ax = plt.subplots(figsize=(size, size))
    im = ax.imshow(matrix, cmap="Blues", aspect="auto")
    ax.set_xticks(range(m))
    ax.set_yticks(range(n))
    fs = 8 if max(n, m) <= 15 else 5
    ax.set_xticklabels([_safe(c, 18) for c in cols], rotation=60, ha="right", fontsize=fs)
    ax.set_yticklabels([_safe(r, 18) for r in rows], fontsize=fs)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(_safe(title, 60))
    if max(n, m) <= 15:
        top = max((max(r) for r in matrix if r), default=0) or 1
        for i, r in enumerate(matrix):
            for j, v in enumerate(r):
                ax.text(j, i, str(v), ha="center", va="center", fontsize=8, color="white" if v > top / 2 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return _png(fig)


def token_lengths(
    lengths: dict[str, list[int]] | None, stats: dict[str, dict[str, Any]] | None, max_length: int | None
) -> bytes | None:
    """Token lengths per split: a histogram when the raw lengths were stored, else bars of the
    stored percentiles (p50, p95, p99, max); ``max_length`` drawn as a vertical/horizontal line."""
    plt = _plt()
    if lengths:
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for split, vals in lengths.items():
            if vals:
                ax.hist(vals, bins=min(40, max(5, len(set(vals)))), alpha=0.55, label=_safe(split))
        if max_length:
            ax.axvline(max_length, color="red", linestyle="--", label=f"max_length {max_length}")
        ax.set_xlabel("tokens per example (before truncation)")
        ax.set_ylabel("examples")
        ax.set_title("token-length histogram per split")
        ax.legend(fontsize=8)
        return _png(fig)
    stats = {k: v for k, v in (stats or {}).items() if isinstance(v, dict)}
    if not stats:
        return None
    keys = [k for k in ("p50", "p95", "p99", "max") if any(isinstance(v.get(k), (int, float)) for v in stats.values())]
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    w = 0.8 / max(1, len(stats))
    for i, (split, v) in enumerate(stats.items()):
        ax.bar([j + i * w for j in range(len(keys))], [v.get(k) or 0 for k in keys], width=w, label=_safe(split))
    ax.set_xticks([j + w * (len(stats) - 1) / 2 for j in range(len(keys))])
    ax.set_xticklabels(keys)
    if max_length:
        ax.axhline(max_length, color="red", linestyle="--", label=f"max_length {max_length}")
    ax.set_xlabel("percentile of the split's token lengths")
    ax.set_ylabel("tokens per example")
    ax.set_title("token lengths per split (percentiles stored by the data check)")
    ax.legend(fontsize=8)
    return _png(fig)


def memory_throughput(memory_gib: dict[str, float], throughput: dict[str, float]) -> bytes | None:
    """Step memory (GiB, e.g. measured peak next to the estimate's items) and throughput bars."""
    if not memory_gib and not throughput:
        return None
    plt = _plt()
    panels = [
        (t, d, x)
        for t, d, x in (
            ("step memory (GiB)", memory_gib, "GiB"),
            ("throughput", throughput, "value (unit in the name)"),
        )
        if d
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(7 if len(panels) == 1 else 9, 3.4), squeeze=False)
    for ax, (title, data, xlabel) in zip(axes[0], panels):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("quantity (preflight)")
        names = list(data)
        ax.barh(range(len(names)), [data[k] for k in names], color="#2f6fb3")
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([_safe(k, 30) for k in names], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
        for i, k in enumerate(names):
            ax.text(data[k], i, f" {data[k]:.3g}", va="center", fontsize=7)
    return _png(fig)
