import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { hostDebianMirror } from "./mirror.js";

describe("host Debian mirror", () => {
  it("reads deb822 .sources stanzas, skipping security and other suites", () => {
    const dir = mkdtempSync(join(tmpdir(), "apt-"));
    mkdirSync(join(dir, "sources.list.d"));
    writeFileSync(
      join(dir, "sources.list.d", "debian.sources"),
      "Types: deb\nURIs: http://deb.example.org/debian-security\nSuites: bookworm-security\n\nTypes: deb\nURIs: http://mirror.example.org/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n",
    );
    writeFileSync(join(dir, "sources.list.d", "node.list"), "deb https://deb.nodesource.com/node_20.x nodistro main\n");
    expect(hostDebianMirror("bookworm", dir)).toBe("http://mirror.example.org/debian");
  });

  it("reads one-line entries and gives undefined when the suite is absent", () => {
    const dir = mkdtempSync(join(tmpdir(), "apt-"));
    writeFileSync(
      join(dir, "sources.list"),
      "# comment\ndeb [arch=amd64] http://ftp.example.org/debian bookworm main\n",
    );
    expect(hostDebianMirror("bookworm", dir)).toBe("http://ftp.example.org/debian");
    expect(hostDebianMirror("trixie", dir)).toBeUndefined();
  });
});
