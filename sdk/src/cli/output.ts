/** Where a command's results go: JSON for scripts (`--json`), or text for people; progress always on stderr. */
export class Output {
  constructor(readonly json: boolean) {}

  /** Prints a command's result: `value` as one JSON document, else the `text` lines. */
  result(value: unknown, text: () => string | string[]): void {
    if (this.json) {
      process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
      return;
    }
    const lines = text();
    const out = Array.isArray(lines) ? lines.join("\n") : lines;
    if (out !== "") process.stdout.write(`${out}\n`);
  }

  /** A note for people (stderr, so stdout stays the result); silent under --json. */
  note(line: string): void {
    if (!this.json) process.stderr.write(`${line}\n`);
  }

  spinner(text: string): Spinner {
    if (this.json) return new Spinner(text, "silent");
    return new Spinner(text, process.stderr.isTTY === true ? "animated" : "lines");
  }
}

const FRAMES = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/** A one-line spinner on a terminal; without one it prints each step once, as a plain line; silent under --json. */
export class Spinner {
  private frame = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private text: string,
    private readonly mode: "animated" | "lines" | "silent",
  ) {
    if (mode === "animated") {
      this.timer = setInterval(() => this.draw(), 100);
      this.timer.unref();
      this.draw();
    } else if (mode === "lines") {
      process.stderr.write(`warren: ${text}\n`);
    }
  }

  update(text: string): void {
    if (text === this.text) return;
    this.text = text;
    if (this.mode === "animated") this.draw();
    else if (this.mode === "lines") process.stderr.write(`warren: ${text}\n`);
  }

  succeed(text: string): void {
    this.finish("✔", text);
  }

  fail(text: string): void {
    this.finish("✖", text);
  }

  private finish(mark: string, text: string): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    if (this.mode === "animated") process.stderr.write(`\r\x1b[2K${mark} ${text}\n`);
    else if (this.mode === "lines") process.stderr.write(`warren: ${text}\n`);
  }

  private draw(): void {
    this.frame = (this.frame + 1) % FRAMES.length;
    process.stderr.write(`\r\x1b[2K${FRAMES[this.frame]} ${this.text}`);
  }
}

/** Left-aligned columns, the first row the header. */
export function table(rows: readonly (readonly string[])[]): string[] {
  const widths: number[] = [];
  for (const row of rows) {
    for (const [i, cell] of row.entries()) widths[i] = Math.max(widths[i] ?? 0, cell.length);
  }
  return rows.map((row) =>
    row
      .map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd(),
  );
}
