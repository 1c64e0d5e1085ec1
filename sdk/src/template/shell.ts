/** Quotes a word for a POSIX shell like Python's `shlex.quote` (E2B's `shellQuote`). */
export function shellQuote(s: string): string {
  if (s === "") return "''";
  if (!/[^\w@%+=:,./-]/.test(s)) return s;
  return `'${s.replace(/'/g, `'"'"'`)}'`;
}

/** A file mode as four octal digits: 0o755 → "0755". */
export function padOctal(mode: number): string {
  return mode.toString(8).padStart(4, "0");
}
