"""A Java kernel for Warren's code gateway, on the JDK's jshell (jdk.jshell API).

The Jupyter side is ipykernel's Kernel base (as the bash kernel); cells run in WarrenJShell.java, started next
to it in the JVM's single-file source mode, which speaks one JSON line per event over a pipe. SIGINT (the
gateway's interrupt) becomes a `stop` request, which ends the running snippet. If the JVM exits (System.exit in
a cell), the cell fails and a new JVM is started (state lost), as the bash kernel does for bash.

Env vars: a cell made only of `%warren_env <json>` lines ({"set": {...}} or {"unset": [...]}) changes the JVM's
system properties and environment (the gateway's per-execution and sandbox-global env vars use it).
"""

import base64
import json
import os
import signal
import subprocess
import sys

# Keep the gateway's kernel files off the import path, and skip ipykernel's debugger (unused).
HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and sys.path[0]:
    del sys.path[0]
sys.modules["debugpy"] = None

from ipykernel.kernelapp import IPKernelApp  # noqa: E402
from ipykernel.kernelbase import Kernel  # noqa: E402

ENV_DIRECTIVE = "%warren_env "
# The gateway names the JDK's java (its config); ipykernel must not see that argument.
JAVA = "java"
for _arg in list(sys.argv):
    if _arg.startswith("--java="):
        JAVA = _arg[len("--java="):]
        sys.argv.remove(_arg)
JVM_OPTIONS = [
    # The JVM shares the sandbox's memory with the other kernels: a small-footprint collector, no JIT tier 2
    # (cells are short), no perf-data file in /tmp.
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Xss4m",
    # Env vars reach System.getenv through the JVM's environment map (see WarrenJShell.Environment).
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "-Dfile.encoding=UTF-8",
]


def _b64(text):
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


class JavaExited(Exception):
    pass


class JShellKernel(Kernel):
    implementation = "warren_jshell"
    implementation_version = "0.1"
    language = "java"
    language_version = "17"
    language_info = {"name": "java", "mimetype": "text/x-java-source", "file_extension": ".jshell",
                     "codemirror_mode": "java"}
    banner = "Warren Java kernel (jshell)"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._start_java()

    def _start_java(self):
        request_read, request_write = os.pipe()
        event_read, event_write = os.pipe()
        self.java = subprocess.Popen(
            [JAVA, *JVM_OPTIONS, os.path.join(HERE, "WarrenJShell.java"), str(request_read), str(event_write)],
            stdin=subprocess.DEVNULL,
            pass_fds=(request_read, event_write),
            cwd=os.getcwd(),
            # The kernel ignores SIGINT outside cells; the JVM must not inherit that. It stays in the kernel's
            # process group (the gateway kills the group) but gets no SIGINT: the gateway signals this process only.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        os.close(request_read)
        os.close(event_write)
        self.requests = os.fdopen(request_write, "wb", buffering=0)
        self.events = os.fdopen(event_read, "rb")
        event = self._next_event()
        if event.get("t") != "ready":
            raise RuntimeError(f"jshell did not start: {event}")

    def _next_event(self):
        line = self.events.readline()
        if not line:
            raise JavaExited()
        return json.loads(line)

    def _request(self, line, on_event):
        self.requests.write((line + "\n").encode("ascii"))
        while True:
            try:
                event = self._next_event()
            except KeyboardInterrupt:
                self.requests.write(b"stop\n")
                continue
            if event.get("t") == "done":
                return
            on_event(event)

    def _requests_for(self, code):
        lines = [line for line in code.splitlines() if line.strip()]
        if lines and all(line.startswith(ENV_DIRECTIVE) for line in lines):
            requests = []
            for line in lines:
                change = json.loads(line[len(ENV_DIRECTIVE):])
                for name, value in change.get("set", {}).items():
                    requests.append(f"setenv {_b64(name)} {_b64(value)}")
                for name in change.get("unset", []):
                    requests.append(f"unsetenv {_b64(name)}")
            return requests
        return [f"eval {_b64(code)}"]

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False, **kwargs):
        failure = {}

        def on_event(event):
            kind = event.get("t")
            if kind == "error":
                failure.update(ename=event["ename"], evalue=event["evalue"], traceback=event["traceback"])
            if silent:
                return
            if kind in ("stdout", "stderr"):
                self.send_response(self.iopub_socket, "stream", {"name": kind, "text": event["text"]})
            elif kind == "result":
                self.send_response(self.iopub_socket, "execute_result", {
                    "execution_count": self.execution_count,
                    "data": {"text/plain": event["text"]},
                    "metadata": {},
                })
            elif kind == "error":
                self.send_response(self.iopub_socket, "error", {
                    "ename": event["ename"], "evalue": event["evalue"], "traceback": event["traceback"],
                })

        try:
            for request in self._requests_for(code):
                self._request(request, on_event)
                if failure:
                    break
        except (JavaExited, BrokenPipeError):
            code_ = self.java.wait()
            self._close_pipes()
            self._start_java()
            on_event({"t": "error", "ename": "JavaExited",
                      "evalue": f"the JVM exited (code {code_}); a new one was started and its state is lost",
                      "traceback": []})
        if failure:
            return {"status": "error", "execution_count": self.execution_count, **failure}
        return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}

    def _close_pipes(self):
        for pipe in (self.requests, self.events):
            try:
                pipe.close()
            except OSError:
                pass

    def do_shutdown(self, restart):
        self._close_pipes()  # the JVM reads end-of-file and exits
        try:
            self.java.wait(timeout=1)
        except subprocess.TimeoutExpired:
            self.java.kill()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=JShellKernel)
