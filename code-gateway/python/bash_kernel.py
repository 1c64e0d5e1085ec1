"""A stateful Bash kernel for Warren's code gateway.

One long-lived interactive bash (no readline, so no bracketed-paste escapes) runs on a
pty under pexpect. Each cell is written to a file and sourced with stdin from /dev/null,
so variables, functions, cwd and exports persist between cells; a marker line carrying
$? ends the cell. Output is streamed as it arrives. SIGINT (the gateway's interrupt)
is forwarded to the cell's foreground job as ^C.
"""

import os
import re
import signal
import sys
import tempfile
import uuid

# Keep the gateway's kernel files off the import path, and skip ipykernel's debugger (unused).
if sys.path and sys.path[0]:
    del sys.path[0]
sys.modules["debugpy"] = None

import pexpect  # noqa: E402
from ipykernel.kernelapp import IPKernelApp  # noqa: E402
from ipykernel.kernelbase import Kernel  # noqa: E402


class BashKernel(Kernel):
    implementation = "warren_bash"
    implementation_version = "0.1"
    language = "bash"
    language_version = "5"
    language_info = {"name": "bash", "mimetype": "text/x-sh", "file_extension": ".sh", "codemirror_mode": "shell"}
    banner = "Warren bash kernel"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._token = uuid.uuid4().hex
        self._marker = re.compile(r"\x1eWARREN_END_" + self._token + r"_(\d+)\x1e\n")
        # Cells live next to the connection file, in the gateway's per-kernel directory, which
        # the gateway removes whatever way the kernel ends.
        connection_file = IPKernelApp.instance().connection_file
        self._cell_dir = os.path.dirname(connection_file) if connection_file else tempfile.mkdtemp(prefix="warren-bash-")
        self._cell_file = os.path.join(self._cell_dir, "cell.sh")
        self._start_bash()

    def _start_bash(self):
        env = dict(os.environ)
        env["PS1"] = ""
        env["PS2"] = ""
        env["TERM"] = "dumb"
        self.bash = pexpect.spawn(
            "/bin/bash",
            ["--noprofile", "--norc", "--noediting", "-i"],
            echo=False,
            encoding="utf-8",
            codec_errors="replace",
            env=env,
            cwd=os.getcwd(),
            dimensions=(24, 200),
            # The kernel ignores SIGINT outside cells; bash and its jobs must not inherit that.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        # pexpect sleeps 50 ms before every send by default; cells would pay it twice.
        self.bash.delaybeforesend = None
        self.bash.sendline("PS1=''; PS2=''; PROMPT_COMMAND=''; unset HISTFILE; stty -echo noflsh 2>/dev/null")
        self._run("true", None)

    def _run(self, code, on_output):
        with open(self._cell_file, "w") as f:
            f.write(code)
            if not code.endswith("\n"):
                f.write("\n")
        self.bash.sendline(f"source {self._cell_file} </dev/null")
        self.bash.sendline(f"printf '\\036WARREN_END_{self._token}_%d\\036\\n' $?")
        pending = ""
        while True:
            try:
                chunk = self.bash.read_nonblocking(65536, timeout=None)
            except KeyboardInterrupt:
                self.bash.sendintr()
                continue
            except pexpect.EOF:
                raise RuntimeError("bash exited")
            pending += chunk.replace("\r\n", "\n")
            match = self._marker.search(pending)
            if match:
                before = pending[: match.start()]
                if before and on_output:
                    on_output(before)
                return int(match.group(1))
            # Keep a possible partial marker back; emit the rest now.
            cut = pending.rfind("\x1e")
            emit, pending = (pending[:cut], pending[cut:]) if cut != -1 else (pending, "")
            if emit and on_output:
                on_output(emit)

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False, **kwargs):
        def on_output(text):
            if not silent:
                self.send_response(self.iopub_socket, "stream", {"name": "stdout", "text": text})

        try:
            self._run(code, on_output)
        except RuntimeError:
            self._start_bash()
            if not silent:
                self.send_response(
                    self.iopub_socket,
                    "error",
                    {"ename": "BashExited", "evalue": "bash exited; a new shell was started", "traceback": []},
                )
            return {"status": "error", "execution_count": self.execution_count, "ename": "BashExited",
                    "evalue": "bash exited", "traceback": []}
        return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}

    def do_shutdown(self, restart):
        self.bash.close(force=True)
        try:
            os.remove(self._cell_file)
        except OSError:
            pass
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=BashKernel)
