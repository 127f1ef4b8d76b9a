"""Charts as inline SVG: matplotlib's Agg backend, text kept as text, and element ids drawn from
the content, so the same results give the same file and page."""

from __future__ import annotations

import io


def pyplot():
    """matplotlib.pyplot, set up for SVG that can sit inline in a page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, sharper, searchable
    plt.rcParams["svg.hashsalt"] = "softeval"  # element ids from the content: the same results, the same page
    return plt


def inline_svg(fig) -> str:
    """The figure as an <svg> element (no XML prolog, no external references); closes the figure."""
    plt = pyplot()
    buffer = io.StringIO()
    try:
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    finally:
        plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]
