# Runs inside every Python kernel before its first cell (IPKernelApp.exec_files).
# Registers the "e2b/data" MIME type E2B's SDK reads as `result.data`: a pandas DataFrame
# becomes {column: [values...]}. Registered by type name so pandas is imported only by
# user code, never at kernel start. Also makes PIL images display as results.


def __warren_setup():
    import json

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

    shell = get_ipython()
    if shell is None:
        return
    display = shell.display_formatter
    formatter = E2BDataFormatter(parent=display)
    formatter.for_type_by_name("pandas.core.frame", "DataFrame", dataframe_data)
    display.formatters["e2b/data"] = formatter
    if "e2b/data" not in display.active_types:
        display.active_types.append("e2b/data")


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
