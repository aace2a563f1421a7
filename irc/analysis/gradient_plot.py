"""``irc analyze --gradients --gradients-plot FILE.png``: gradient norm against depth, as a PNG.

One panel per depth profile (‖∂L/∂h‖ and ‖∂L/∂W‖ of each block or layer, log scale) and one per
recurrent layer's time profile (‖∂L_T/∂x_t‖ per step). matplotlib is an optional dependency (the
``irc[train]`` extra): without it the flag is a usage error (exit 2) raised before any measuring.
The file is written atomically (irc/output_files.py), with no timestamp or version in its metadata.
"""

from __future__ import annotations

from typing import Any

from irc.analysis.gradients import GradientReport
from irc.diagnostics import IrcError, UsageError

FLAG = "--gradients-plot"


def require_matplotlib() -> None:
    """Exit 2 naming the extra when matplotlib cannot be imported (checked before the measurement)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"{FLAG} draws with matplotlib, which is not installed: pip install 'irc[train]' "
                         "(or pip install matplotlib)") from None


def _positive(xs: list[int], ys: list[float | None]) -> tuple[list[int], list[float]]:
    """The points a log axis can show (no None, zero or non-finite norm)."""
    keep = [(x, y) for x, y in zip(xs, ys) if y is not None and 0 < y < float("inf")]
    return [x for x, _ in keep], [y for _, y in keep]


def _panels(r: GradientReport) -> list[tuple[str, str, list[tuple[str, list[int], list[float | None]]]]]:
    """(title, x label, [(series label, x, y)]) per panel."""
    out = []
    for d in r.depth:
        xs = list(range(1, len(d.blocks) + 1))
        series = [("‖∂L/∂h‖ (block output)", xs, [b.activation_grad_norm for b in d.blocks]),
                  ("‖∂L/∂W‖ (block weights)", xs, [b.grad_norm for b in d.blocks])]
        unit = "block" if d.stack != "layers" else "layer"
        out.append((f"depth: {d.stack}", f"{unit} (1 = nearest the input)", series))
    for t in r.time:
        xs = list(range(1, len(t.grad_norms) + 1))
        out.append((f"time: {t.layer} ({t.op})", "step t", [("‖∂L_T/∂x_t‖", xs, list(t.grad_norms))]))
    return out


def write_plot(r: GradientReport, path: str) -> None:
    """Draw the report's profiles into ``path`` (PNG)."""
    from irc.output_files import write_atomically

    panels = _panels(r)
    if not panels:
        raise IrcError(f"{FLAG}: model '{r.model}' has no repeated blocks, weight-owning layers or recurrent "
                       "inputs, so there is no gradient norm against depth to plot")
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(6.4, 3.2 * len(panels)), dpi=100, squeeze=False)
    try:
        for ax, (title, xlabel, series) in zip(axes[:, 0], panels):
            _draw(ax, series)
            ax.set_title(title)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("gradient norm")
        fig.suptitle(f"{r.model}: gradients at initialisation (loss {r.loss}, seed {r.seed}, "
                     f"{r.batches} batch{'es' if r.batches != 1 else ''})", fontsize=10)
        fig.tight_layout()
        write_atomically(path, lambda f: fig.savefig(f, format="png", metadata={"Software": None}))
    finally:
        plt.close(fig)


def _draw(ax: Any, series: list[tuple[str, list[int], list[float | None]]]) -> None:
    drawn = False
    for label, xs, ys in series:
        px, py = _positive(xs, ys)
        if px:
            ax.plot(px, py, "o-", ms=3, lw=1, label=label)
            drawn = True
    if drawn:
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no non-zero norm to show", ha="center", va="center", transform=ax.transAxes)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # blocks and steps are whole numbers
    ax.grid(alpha=0.3, which="both")
