"""The picture of a plan: the chip grid, each directed link coloured by its predicted load, each
chip labelled with its logical rank. Needs matplotlib (``pip install aoizora[plot]``)."""

from __future__ import annotations

import os

from aoizora.extract.atomic_io import atomic_open
from aoizora.plans import Plan, PlanError


def draw_plan(p: Plan, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import cm, colors
    except ImportError:
        raise PlanError("drawing needs matplotlib: pip install 'aoizora[plot]'") from None
    links = p.predicted.get("links") or []
    coords = [tuple(c) for c in p.device_coords]
    if not coords or len(coords[0]) < 2:
        raise PlanError("this plan has no 2-D chip coordinates to draw")
    X = 1 + max(c[0] for c in coords)
    Y = 1 + max(c[1] for c in coords)
    if any(len(c) > 2 and c[2] for c in coords):
        raise PlanError("drawing 3-D slices is not supported; use aoizora show without --png")
    peak = max((l["seconds"] for l in links), default=0.0) or 1.0
    norm = colors.Normalize(vmin=0.0, vmax=peak * 1e3)
    cmap = matplotlib.colormaps["inferno_r"]
    fig, ax = plt.subplots(figsize=(1.6 * X + 2.0, 1.6 * Y + 0.8))
    for l in links:
        (x0, y0), (x1, y1) = l["from"][:2], l["to"][:2]
        if abs(x1 - x0) + abs(y1 - y0) != 1:
            continue  # wraparound links are listed in the legend only
        # offset the two directions of one physical link so both show
        dx, dy = x1 - x0, y1 - y0
        off = 0.08
        ox, oy = -dy * off, dx * off
        ax.annotate("", xy=(x1 + ox - 0.25 * dx, y1 + oy - 0.25 * dy),
                    xytext=(x0 + ox + 0.25 * dx, y0 + oy + 0.25 * dy),
                    arrowprops=dict(arrowstyle="-|>", lw=3, color=cmap(norm(l["seconds"] * 1e3))))
    for r, c in enumerate(coords):
        ax.add_patch(plt.Rectangle((c[0] - 0.22, c[1] - 0.22), 0.44, 0.44, fc="#dde8f6", ec="#345"))
        ax.text(c[0], c[1], f"r{r}", ha="center", va="center", fontsize=11, weight="bold")
    ax.set_xlim(-0.6, X - 0.4)
    ax.set_ylim(Y - 0.4, -0.6)
    ax.set_aspect("equal")
    ax.set_xticks(range(X))
    ax.set_yticks(range(Y))
    ax.set_xlabel("chip x")
    ax.set_ylabel("chip y")
    mesh = " x ".join(f"{k}={v}" for k, v in p.mesh.items())
    step = p.predicted.get("step_s")
    ax.set_title(f"{p.target}, mesh {mesh}: logical rank per chip, link load\n"
                 f"predicted step {step * 1e3:.2f} ms (Q2 model)" if step else p.target, fontsize=9)
    sm = cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=ax, label="link busy time per step, ms (predicted)")
    fig.tight_layout()
    with atomic_open(path, "wb") as f:     # a failed or interrupted save keeps the old file
        fig.savefig(f, dpi=110, format=os.path.splitext(str(path))[1].lstrip(".") or "png")
    plt.close(fig)
