# Runs inside every Python kernel before its first cell (IPKernelApp.exec_files).
# Registers the "e2b/data" MIME type E2B's SDK reads as `result.data`: a pandas DataFrame
# becomes {column: [values...]}, and "e2b/chart", read as `result.chart`: a matplotlib Figure
# becomes structured chart data (warren_charts.py). The first is registered by type name and the
# second looks for matplotlib in sys.modules, so pandas and matplotlib are imported only by user
# code, never at kernel start. Also makes PIL images display as results.


def __warren_setup():
    import json
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class E2BDataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, list)

    def dataframe_data(df):
        split = json.loads(df.to_json(orient="split", date_format="iso"))
        return {str(c): [row[i] for row in split["data"]] for i, c in enumerate(split["columns"])}

    # exec_files puts this file's directory on sys.path while it runs (and only then).
    from warren_charts import figure_chart

    class E2BChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            # Not a type printer: matplotlib-inline removes every formatter's Figure printer when
            # pyplot is first imported (select_figure_formats). A Figure exists only once user code
            # has imported matplotlib.figure, so nothing is imported here.
            figure_module = sys.modules.get("matplotlib.figure")
            if self.enabled and figure_module is not None and isinstance(obj, figure_module.Figure):
                return figure_chart(obj)
            return super().__call__(obj)

    shell = get_ipython()
    if shell is None:
        return
    display = shell.display_formatter
    data_formatter = E2BDataFormatter(parent=display)
    data_formatter.for_type_by_name("pandas.core.frame", "DataFrame", dataframe_data)
    # A figure displays (plt.show(), the inline backend at the end of a cell, or as the cell's value)
    # with its PNG and, from this formatter, its chart; figure_chart answers None for blank figures.
    chart_formatter = E2BChartFormatter(parent=display)
    for mime, formatter in (("e2b/data", data_formatter), ("e2b/chart", chart_formatter)):
        display.formatters[mime] = formatter
        if mime not in display.active_types:
            display.active_types.append(mime)


def __warren_pil_display():
    # E2B's template shows PIL images as results: Image.show() displays the image instead of
    # opening a viewer, and Image.save(path) also displays what it saved.
    try:
        from PIL import Image
    except ImportError:
        return
    import os

    from IPython.display import display

    save = Image.Image.save

    def show(self, title=None, **options):
        display(self)

    def save_and_display(self, fp, format=None, **params):
        save(self, fp, format, **params)
        # Only saves to a path: PNG rendering for display itself saves into a buffer.
        if isinstance(fp, (str, os.PathLike)):
            display(self)

    Image.Image.show = show
    Image.Image.save = save_and_display


__warren_setup()
__warren_pil_display()
del __warren_setup, __warren_pil_display
