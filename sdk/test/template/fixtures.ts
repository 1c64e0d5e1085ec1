import { chmodSync, mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";

/** A context directory with files, dotfiles, nested dirs, symlinks (to a file, a dir, nowhere) and glob-ish names. */
export function makeContext(prefix = "warren-tpl-ctx-"): string {
  const ctx = mkdtempSync(join(tmpdir(), prefix));
  const files: Record<string, string> = {
    "hello.txt": "hello\n",
    "a.txt": "a\n",
    "b.log": "log\n",
    ".env": "SECRET=1\n",
    "app/main.py": "print('hi')\n",
    "app/.config": "x\n",
    "app/lib/util.py": "def f(): pass\n",
    "app/lib/deep/data.json": "{}\n",
    "app/node_modules/m/index.js": "module.exports = 1\n",
    "d/1.txt": "1\n",
    "d/2.md": "2\n",
    "other/o1": "o1\n",
    "other/inner/o2": "o2\n",
    "sp ace/f g.txt": "space\n",
    "weird[1]/w.txt": "w\n",
    "exec.sh": "#!/bin/sh\necho run\n",
    "empty.bin": "",
  };
  for (const [path, content] of Object.entries(files)) {
    mkdirSync(dirname(join(ctx, path)), { recursive: true });
    writeFileSync(join(ctx, path), content);
    chmodSync(join(ctx, path), 0o644);
  }
  chmodSync(join(ctx, "exec.sh"), 0o755);
  mkdirSync(join(ctx, "emptydir"));
  symlinkSync("a.txt", join(ctx, "link-to-a"));
  symlinkSync("../other", join(ctx, "app", "linkdir"));
  symlinkSync("other", join(ctx, "toplinkdir"));
  symlinkSync("nowhere", join(ctx, "broken"));
  return ctx;
}
