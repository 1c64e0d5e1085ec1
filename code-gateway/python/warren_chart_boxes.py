"""Box-and-whisker geometry for warren_charts: the five numbers and the outliers of each box.

`boxplot(patch_artist=True)` leaves one PathPatch per box, and Line2Ds in data coordinates for the
whiskers (from the middle of a box's edge outwards), the caps, the median (across the box), the
means and the fliers (markers only). The numbers are read from that geometry, not from the order
in which matplotlib happened to add the lines (except to tell fliers from a mean marker).
Coordinates are handled as (position, value): (x, y) for vertical boxes, (y, x) for horizontal ones.
"""

import math

from warren_chart_axes import close


def box_is_vertical(ax):
    """Vertical when more whiskers run along y than along x; a tie is matplotlib's default, vertical."""
    boxes = [_bounds(patch) for patch in _box_patches(ax)]
    lines = _line_points(ax)
    along_y = sum(_whisker_count(_oriented(box, True), _oriented_lines(lines, True)) for box in boxes)
    along_x = sum(_whisker_count(_oriented(box, False), _oriented_lines(lines, False)) for box in boxes)
    return along_y >= along_x


def box_elements(ax, vertical):
    """Per box, in drawing order: center (its position), min, first_quartile, median,
    third_quartile, max (floats; median None if no median line is drawn) and outliers."""
    lines = _oriented_lines(_line_points(ax), vertical)
    markers = _oriented_lines(_line_points(ax, markers_only=True), vertical)
    return [_box_numbers(_oriented(_bounds(patch), vertical), lines, markers) for patch in _box_patches(ax)]


def _box_numbers(box, lines, markers):
    p0, p1, q1, q3 = box
    center = (p0 + p1) / 2
    lows = [far for edge, far in _whiskers(box, lines) if close(edge, q1) and far <= q1]
    highs = [far for edge, far in _whiskers(box, lines) if close(edge, q3) and far >= q3]
    low = min(lows) if lows else q1
    high = max(highs) if highs else q3
    # matplotlib draws a box's mean marker (showmeans) before its fliers: the last markers are fliers.
    at_center = [vs for ps, vs in markers if ps and all(close(p, center) for p in ps)]
    outliers = [v for v in at_center[-1] if v < low or v > high] if at_center else []
    return {
        "center": center,
        "min": low,
        "first_quartile": q1,
        "median": _median(box, lines, (low, high)),
        "third_quartile": q3,
        "max": high,
        "outliers": outliers,
    }


def _whiskers(box, lines):
    """(edge, far end) of each two-point line that starts on the box's centre line at q1 or q3."""
    p0, p1, q1, q3 = box
    center = (p0 + p1) / 2
    found = []
    for ps, vs in lines:
        if len(ps) != 2 or not (close(ps[0], center) and close(ps[1], center)):
            continue
        for edge, far in ((vs[0], vs[1]), (vs[1], vs[0])):
            if close(edge, q1) or close(edge, q3):
                found.append((edge, far))
                break
    return found


def _whisker_count(box, lines):
    return len(_whiskers(box, lines))


def _median(box, lines, whisker_ends):
    """The widest level line across the box (caps are narrower by default); among equals, one that
    is not a cap at a whisker's end."""
    p0, p1, q1, q3 = box
    across = [
        (abs(ps[1] - ps[0]), vs[0])
        for ps, vs in lines
        if len(ps) == 2
        and close(vs[0], vs[1])
        and not close(ps[0], ps[1])
        and _within(ps[0], p0, p1)
        and _within(ps[1], p0, p1)
        and _within(vs[0], q1, q3)
    ]
    if not across:
        return None
    widest = max(width for width, _ in across)
    levels = [v for width, v in across if close(width, widest)]
    inner = [v for v in levels if not any(close(v, end) for end in whisker_ends)]
    return (inner or levels)[0]


def _box_patches(ax):
    from matplotlib.patches import PathPatch

    return [patch for patch in ax.patches if isinstance(patch, PathPatch)]


def _bounds(patch):
    vertices = patch.get_patch_transform().transform(patch.get_path().vertices)
    xs, ys = vertices[:, 0], vertices[:, 1]
    return float(xs.min()), float(xs.max()), float(ys.min()), float(ys.max())


def _oriented(bounds, vertical):
    x0, x1, y0, y1 = bounds
    return (x0, x1, y0, y1) if vertical else (y0, y1, x0, x1)


def _line_points(ax, markers_only=False):
    """(xs, ys) of the Axes' data lines as finite floats; with markers_only, only lines drawn as
    markers without a connecting line (fliers, mean markers)."""
    import numpy

    found = []
    for line in ax.lines:
        if line.get_transform() is not ax.transData:
            continue
        if markers_only and line.get_linestyle() not in ("None", "none", "", " "):
            continue
        try:
            xs = numpy.asarray(line.get_xdata(), dtype=float)
            ys = numpy.asarray(line.get_ydata(), dtype=float)
        except (TypeError, ValueError):
            continue
        pairs = [(x, y) for x, y in zip(xs.tolist(), ys.tolist()) if math.isfinite(x) and math.isfinite(y)]
        found.append(([x for x, _ in pairs], [y for _, y in pairs]))
    return found


def _oriented_lines(lines, vertical):
    return lines if vertical else [(ys, xs) for xs, ys in lines]


def _within(value, low, high):
    return low <= value <= high or close(value, low) or close(value, high)
