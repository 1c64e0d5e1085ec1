"""Axes and values for warren_charts: ticks, scales, units, and data values in E2B's JSON forms.

Dates are ISO 8601 strings, numbers are floats (NaN and infinities become null), categories are
their names. matplotlib, numpy and pandas are imported inside the functions: only user code that
drew a figure gets here.
"""

import datetime
import math
import re

_UNIT = re.compile(r"\s\(([^()]*)\)|\[([^\[\]]*)\]")
_SIGNIFICANT_DIGITS = 12
_NUMERIC_KINDS = "biuf"


def label_unit(label):
    """The unit in an axis label, "Time (s)" → "s", "Length [m]" → "m"; None without one."""
    match = _UNIT.search(label) if label else None
    return (match.group(1) or match.group(2)) if match else None


# --- ticks and scales ----------------------------------------------------------------------


def visible_ticks(axis):
    """The major tick locations inside the view limits and the labels matplotlib gives them."""
    locs = list(axis.get_majorticklocs())
    labels = list(axis.get_major_formatter().format_ticks(locs))
    low, high = sorted(axis.get_view_interval())
    kept = [
        (loc, str(label))
        for loc, label in zip(locs, labels)
        if low <= loc <= high or close(loc, low) or close(loc, high)
    ]
    return [loc for loc, _ in kept], [label for _, label in kept]


def tick_value(axis, tick):
    """A tick as E2B reports it: ISO strings on date axes, else its position (also for categories)."""
    if is_date_axis(axis):
        return date_number_iso(axis, tick)
    return rounded(tick)  # 1.2, not the locator's 1.2000000000000002


def axis_scale(axis, ticks, labels):
    """E2B's ScaleType of an axis: datetime, categorical, or matplotlib's scale name."""
    if is_date_axis(axis):
        return "datetime"
    if _category_names(axis) is not None:
        return "categorical"
    scale = axis.get_scale()
    if scale != "linear":
        return scale
    # plt.xticks(range(n), names) makes a linear axis read as categories.
    if ticks and all(tick == i and not _reads_as(label, i) for i, (tick, label) in enumerate(zip(ticks, labels))):
        return "categorical"
    return "linear"


def _reads_as(label, number):
    try:
        return float(label.replace("\u2212", "-")) == number
    except ValueError:
        return False


def is_date_axis(axis):
    from matplotlib import dates

    switchable = getattr(dates, "_SwitchableDateConverter", ())
    return isinstance(_converter(axis), (dates.DateConverter, switchable))


def _converter(axis):
    if hasattr(axis, "get_converter"):  # matplotlib >= 3.10
        return axis.get_converter()
    return axis.converter


def _category_names(axis):
    """{position: name} of a string-category axis, else None."""
    from matplotlib.category import StrCategoryConverter

    if not isinstance(_converter(axis), StrCategoryConverter) or axis.units is None:
        return None
    return {position: str(name) for name, position in axis.units._mapping.items()}


def date_number_iso(axis, number):
    freq = getattr(axis, "freq", None)
    if freq is not None:
        # pandas plots regular time series in period ordinals, not matplotlib date numbers.
        import pandas

        return pandas.Period(ordinal=int(round(number)), freq=freq).start_time.isoformat()
    from matplotlib import dates

    return dates.num2date(number).isoformat()


# --- positions back in the user's units ----------------------------------------------------


def axis_values(axis, numbers):
    """Values in an axis' drawing units (scatter offsets, bar centres) back in the user's units."""
    names = _category_names(axis)
    dates = is_date_axis(axis)
    values = []
    for number in numbers:
        if number is None or not math.isfinite(number):
            values.append(None)
        elif dates:
            values.append(date_number_iso(axis, number))
        elif names is not None and number in names:
            values.append(names[number])
        else:
            values.append(float(number))
    return values


def category_labels(axis, centers):
    """The label of each bar or box at `centers` on a category axis: the tick at its centre, else the
    tick of the same rank when there are as many ticks as centres (grouped bars), else the centre."""
    ticks, labels = visible_ticks(axis)
    by_rank = len(ticks) == len(centers)
    positions = axis_values(axis, centers)
    result = []
    for rank, center in enumerate(centers):
        at_center = [label for tick, label in zip(ticks, labels) if close(tick, center)]
        if at_center:
            result.append(at_center[0])
        elif by_rank:
            result.append(labels[rank])
        else:
            position = positions[rank]
            result.append(position if isinstance(position, str) else f"{center:g}")
    return result


# --- data values ---------------------------------------------------------------------------


def point_pairs(xs, ys):
    """[[x, y], ...] of json_values; numeric data in one numpy pass (a line may hold a million points)."""
    import numpy

    x_array, y_array = numpy.ma.asarray(xs), numpy.ma.asarray(ys)
    numeric = x_array.dtype.kind in _NUMERIC_KINDS and y_array.dtype.kind in _NUMERIC_KINDS
    if numeric and x_array.shape == y_array.shape:
        pairs = numpy.ma.filled(numpy.ma.column_stack([x_array, y_array]).astype(float), math.nan)
        points = pairs.tolist()
        if not numpy.isfinite(pairs).all():
            points = [[v if math.isfinite(v) else None for v in point] for point in points]
        return points
    return [[json_value(x), json_value(y)] for x, y in zip(xs, ys)]


def json_value(value):
    """A data value as JSON: numbers as floats (NaN and infinities as null), dates as ISO strings."""
    import numbers

    if value is None:
        return None
    if isinstance(value, str):
        return str(value)  # numpy.str_ too
    if isinstance(value, (datetime.date, datetime.time)):
        return None if value != value else value.isoformat()  # pandas.NaT is a datetime
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return _numpy_or_pandas_value(value)


def _numpy_or_pandas_value(value):
    import numpy

    if isinstance(value, numpy.datetime64):
        if numpy.isnat(value):
            return None
        seconds = value.astype("datetime64[s]")
        return str(seconds if seconds == value else value.astype("datetime64[us]"))
    if hasattr(value, "to_timestamp"):  # pandas.Period
        return value.to_timestamp().isoformat()
    return str(value)


def rounded(number):
    """`number` without floating-point noise (1.2000000000000002 → 1.2); None stays None."""
    if number is None:
        return None
    value = float(f"{float(number):.{_SIGNIFICANT_DIGITS}g}")
    return value + 0.0 if math.isfinite(value) else None


def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
