"""Starts an IPython kernel (ipykernel) for Warren's code gateway.

Like `python -m ipykernel_launcher`, minus the debugger: debugpy is blocked from import,
which saves its start-up cost and the per-cell frame tracking. The gateway never sends
debug_request, so nothing is lost.
"""

import sys

# This directory holds the gateway's own kernel files; user code must not import them by accident.
if sys.path and sys.path[0]:
    del sys.path[0]
sys.modules["debugpy"] = None

from ipykernel import kernelapp  # noqa: E402

if __name__ == "__main__":
    kernelapp.launch_new_instance()
