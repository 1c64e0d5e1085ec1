import { FitAddon } from "@xterm/addon-fit";
import { Terminal as XTerm } from "@xterm/xterm";
import { useEffect, useRef, useState } from "preact/hooks";
import type { EnvdConnection } from "../envd.js";
import { PtySession, type PtyStatus } from "../pty-session.js";

const STATUS_TEXT: Record<PtyStatus, string> = {
  starting: "Starting a shell…",
  live: "Connected",
  reconnecting: "Connection lost: reconnecting (output is replayed)…",
  ended: "The shell ended.",
  failed: "The terminal failed.",
};

/** xterm.js over envd's PTY: typed keys (Ctrl-C included) go in, output comes out, size follows the box. */
export function Terminal(props: { envd: EnvdConnection }) {
  const host = useRef<HTMLDivElement>(null);
  const session = useRef<PtySession | undefined>(undefined);
  const [status, setStatus] = useState<{ status: PtyStatus; detail?: string }>({ status: "starting" });
  const [generation, setGeneration] = useState(0);

  useEffect(() => {
    const el = host.current;
    if (!el) return;
    const styles = getComputedStyle(el);
    const term = new XTerm({
      cursorBlink: true,
      fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace",
      fontSize: 13,
      scrollback: 5000,
      theme: {
        background: styles.getPropertyValue("--term-bg").trim() || "#111",
        foreground: styles.getPropertyValue("--term-fg").trim() || "#ddd",
      },
    });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(el);
    fit.fit();
    const pty = new PtySession(props.envd, {
      onData: (bytes) => term.write(bytes),
      onStatus: (s, detail) => setStatus(detail ? { status: s, detail } : { status: s }),
    });
    session.current = pty;
    const input = term.onData((data) => pty.send(data));
    const resize = term.onResize(({ cols, rows }) => pty.resize(cols, rows));
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(el);
    void pty.start(term.cols, term.rows).catch((error) => setStatus({ status: "failed", detail: String(error) }));
    term.focus();
    return () => {
      observer.disconnect();
      input.dispose();
      resize.dispose();
      pty.close();
      term.dispose();
      session.current = undefined;
    };
  }, [props.envd, generation]);

  return (
    <div class="terminal-pane">
      <div class="toolbar">
        <output class={`term-status term-${status.status}`} data-testid="terminal-status">
          {STATUS_TEXT[status.status]}
          {status.detail ? ` (${status.detail})` : ""}
        </output>
        <button type="button" onClick={() => session.current?.dropStream()} disabled={status.status !== "live"}>
          Reconnect
        </button>
        <button type="button" onClick={() => setGeneration((g) => g + 1)}>
          New shell
        </button>
      </div>
      <div class="terminal" ref={host} data-testid="terminal" />
    </div>
  );
}
