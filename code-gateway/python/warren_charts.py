"""Structured chart data from matplotlib figures: what E2B's SDK reads as `result.chart`.

Runs inside the Python kernel, where python_startup.py registers `figure_chart` as the formatter
of the `e2b/chart` MIME type (the one E2B's template emits and its SDK maps to `chart`). It has to
run there: only the kernel holds the Figure and its artists; the gateway sees nothing but the
rendered PNG. matplotlib is imported only by user code, never by this module at import time.

The output follows @e2b/code-interpreter's `ChartTypes`: `line`, `scatter`, `bar`, `pie`,
`box_and_whisker`, `superchart` (a figure with several charts) and `unknown`, with E2B's field
names. It reads some figures differently from E2B's extractor
(code-gateway/README.md lists how): bar orientation comes from the BarContainer, each bar and box is
labelled by the category tick at its position, every outlier of a box is kept, error bars and
reference lines are decorations, ticks are those inside the view limits, empty subplots and
colorbars are no charts, and values are JSON-safe (NaN becomes null).
"""

import gc
import math

from warren_chart_axes import (
    axis_scale,
    axis_values,
    category_labels,
    json_value,
    label_unit,
    point_pairs,
    rounded,
    tick_value,
    visible_ticks,
)
from warren_chart_boxes import box_elements, box_is_vertical


def figure_chart(figure):
    """The `e2b/chart` value of a Figure, or None when it shows no data (or cannot be read:
    a figure must still display, and the user's stderr is no place for Warren's tracebacks)."""
    # Points become millions of small lists; the cyclic GC would rescan them all many times over.
    collecting = gc.isenabled()
    gc.disable()
    try:
        axes = [ax for ax in figure.axes if _is_chart_axes(ax)]
        if not axes:
            return None
        if len(axes) == 1:
            return axes_chart(axes[0])
        return {
            "type": "superchart",
            "title": _text_or_none(_suptitle(figure)),
            "elements": [axes_chart(ax) for ax in axes],
        }
    except Exception:
        return None
    finally:
        if collecting:
            gc.enable()


def axes_chart(ax):
    """One Axes as a chart; an Axes that cannot be read becomes an `unknown` chart."""
    try:
        extract = _EXTRACTORS.get(chart_type(ax))
        if extract:
            return extract(ax)
    except Exception:
        pass
    return {"type": "unknown", "title": _title(ax), "elements": []}


def chart_type(ax):
    """The chart kind an Axes' data artists make: all of one kind, or `unknown`."""
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge

    decorations = _decoration_ids(ax)
    artists = [a for a in _data_artists(ax) if id(a) not in decorations]
    if all(isinstance(a, Line2D) for a in artists):
        return "line"
    if all(isinstance(a, (PathPatch, Line2D)) for a in artists):
        return "box_and_whisker"
    # Straight two-point lines (thresholds, means) next to points, slices or bars annotate them.
    shapes = [a for a in artists if not (isinstance(a, Line2D) and _is_straight_segment(a))]
    for kind, cls in (("scatter", PathCollection), ("pie", Wedge), ("bar", Rectangle)):
        if all(isinstance(a, cls) for a in shapes):
            return kind
    return "unknown"


# --- artists -------------------------------------------------------------------------------


def _is_chart_axes(ax):
    # A colorbar annotates another chart; an empty subplot of a grid is no chart.
    return getattr(ax, "_colorbar", None) is None and ax.has_data()


def _data_artists(ax):
    # Every artist added to the Axes except texts (titles of slices, annotations, labels).
    return [*ax.lines, *ax.collections, *ax.patches, *ax.images, *ax.tables, *ax.artists]


def _data_lines(ax):
    decorations = _decoration_ids(ax)
    return [line for line in ax.lines if id(line) not in decorations]


def _decoration_ids(ax):
    """ids of the artists that annotate data rather than show it: reference lines (axhline, axvline
    and axline draw in axes or blended coordinates) and error bars (of bar() or errorbar(); the data
    line of errorbar() stays data)."""
    from matplotlib.container import BarContainer, ErrorbarContainer

    ids = {id(line) for line in ax.lines if line.get_transform() is not ax.transData}
    for container in ax.containers:
        if isinstance(container, BarContainer) and container.errorbar is not None:
            ids.update(id(a) for a in container.errorbar.get_children())
        elif isinstance(container, ErrorbarContainer):
            data_line = container.lines[0]
            ids.update(id(a) for a in container.get_children() if a is not data_line)
    return ids


def _is_straight_segment(line):
    xs, ys = line.get_xdata(), line.get_ydata()
    if len(xs) != 2 or len(ys) != 2:
        return False
    try:
        return bool(xs[0] == xs[1] or ys[0] == ys[1])
    except (TypeError, ValueError):
        return False


# --- chart kinds ---------------------------------------------------------------------------


def _line_chart(ax):
    from matplotlib.container import ErrorbarContainer

    chart = _point_chart(ax, "line")
    # errorbar(label=...) labels its container, not its data line.
    named_by = {id(c.lines[0]): c for c in ax.containers if isinstance(c, ErrorbarContainer)}
    for index, line in enumerate(_data_lines(ax)):
        points = point_pairs(line.get_xdata(), line.get_ydata())
        label = _series_label(named_by.get(id(line), line), _series_label(line, f"Line {index}"))
        chart["elements"].append({"label": label, "points": points})
    return chart


def _scatter_chart(ax):
    import numpy
    from matplotlib.collections import PathCollection

    chart = _point_chart(ax, "scatter")
    collections = [c for c in ax.collections if isinstance(c, PathCollection)]
    for index, collection in enumerate(collections):
        offsets = numpy.ma.filled(numpy.ma.asarray(collection.get_offsets(), dtype=float), math.nan)
        points = [list(p) for p in zip(axis_values(ax.xaxis, offsets[:, 0]), axis_values(ax.yaxis, offsets[:, 1]))]
        chart["elements"].append({"label": _series_label(collection, f"Scatter {index}"), "points": points})
    return chart


def _bar_chart(ax):
    from matplotlib.container import BarContainer

    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    horizontal = any(_is_horizontal(c) for c in containers)
    # E2B's bar charts name the category axis x and the value axis y, whatever the orientation.
    category_axis = ax.yaxis if horizontal else ax.xaxis
    chart = _chart_2d(ax, "bar", swap_axes=horizontal)
    for index, container in enumerate(containers):
        # hist(label=[...]) labels the first bar of each dataset, not its container.
        first_bar = container[0] if len(container) else container
        group = _series_label(container, _series_label(first_bar, f"Group {index}"))
        bars = list(container)
        if horizontal:
            centers = [bar.get_y() + bar.get_height() / 2 for bar in bars]
            values = [bar.get_width() for bar in bars]
        else:
            centers = [bar.get_x() + bar.get_width() / 2 for bar in bars]
            values = [bar.get_height() for bar in bars]
        labels = category_labels(category_axis, centers)
        for label, value in zip(labels, values):
            chart["elements"].append({"label": label, "group": group, "value": json_value(value)})
    return chart


def _is_horizontal(container):
    orientation = getattr(container, "orientation", None)
    if orientation:
        return orientation == "horizontal"
    # matplotlib < 3.4 does not record it: barh bars share one height, bar bars one width.
    heights = {bar.get_height() for bar in container}
    widths = {bar.get_width() for bar in container}
    return len(heights) == 1 and len(widths) > 1


def _pie_chart(ax):
    from matplotlib.patches import Wedge

    elements = [
        {
            "label": wedge.get_label(),
            "angle": _degrees(abs(wedge.theta2 - wedge.theta1)),
            "radius": json_value(wedge.r),
        }
        for wedge in ax.patches
        if isinstance(wedge, Wedge)
    ]
    return {"type": "pie", "title": _title(ax), "elements": elements}


def _degrees(angle):
    # pie() computes its fractions in float32: 324.0 arrives as 323.99999; a thousandth of a degree is plenty.
    return round(float(angle), 3) + 0.0


def _box_chart(ax):
    vertical = box_is_vertical(ax)
    chart = _chart_2d(ax, "box_and_whisker", swap_axes=not vertical)
    position_axis = ax.xaxis if vertical else ax.yaxis
    boxes = box_elements(ax, vertical)
    labels = category_labels(position_axis, [box.pop("center") for box in boxes])
    for box, label in zip(boxes, labels):
        numbers = {key: rounded(value) for key, value in box.items() if key != "outliers"}
        outliers = [rounded(value) for value in box["outliers"]]
        chart["elements"].append({"label": label, **numbers, "outliers": outliers})
    return chart


_EXTRACTORS = {
    "line": _line_chart,
    "scatter": _scatter_chart,
    "bar": _bar_chart,
    "pie": _pie_chart,
    "box_and_whisker": _box_chart,
}


# --- shared fields -------------------------------------------------------------------------


def _chart_2d(ax, kind, swap_axes=False):
    x_label, y_label = _text_or_none(ax.get_xlabel()), _text_or_none(ax.get_ylabel())
    if swap_axes:
        x_label, y_label = y_label, x_label
    return {
        "type": kind,
        "title": _title(ax),
        "x_label": x_label,
        "y_label": y_label,
        "x_unit": label_unit(x_label),
        "y_unit": label_unit(y_label),
        "elements": [],
    }


def _point_chart(ax, kind):
    chart = _chart_2d(ax, kind)
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        ticks, labels = visible_ticks(axis)
        chart[f"{name}_ticks"] = [tick_value(axis, tick) for tick in ticks]
        chart[f"{name}_tick_labels"] = labels
        chart[f"{name}_scale"] = axis_scale(axis, ticks, labels)
    return chart


def _title(ax):
    # The centred title, else a left or right one (ax.set_title(loc=...)).
    for loc in ("center", "left", "right"):
        title = ax.get_title(loc)
        if title:
            return title
    return None


def _suptitle(figure):
    if hasattr(figure, "get_suptitle"):  # matplotlib >= 3.8
        return figure.get_suptitle()
    return figure._suptitle.get_text() if figure._suptitle is not None else ""


def _text_or_none(text):
    return text if text else None


def _series_label(artist, default):
    # matplotlib names unlabelled artists "_child3", "_container0", ...: not for a reader.
    label = artist.get_label()
    return default if not label or label.startswith("_") else str(label)
