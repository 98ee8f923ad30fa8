/** Every package the client's code, examples and tests import is one its user (or this checkout's
 * `npm ci`) installs by name: `src` imports only its optional peers (`ai`, `@openai/agents`), the
 * examples and tests only those and the declared devDependencies — never a package that resolves
 * here only because npm hoisted another's dependency (`@openai/agents-core`, which `@openai/agents`
 * brings and re-exports). No live server needed. */
import { readFileSync, readdirSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const root = fileURLToPath(new URL("..", import.meta.url));
const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf-8")) as {
  name: string;
  peerDependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};

function files(dir: string): string[] {
  return readdirSync(join(root, dir), { withFileTypes: true, recursive: true })
    .filter((entry) => entry.isFile() && /\.(ts|mts|cts|mjs|cjs|js)$/.test(entry.name))
    .map((entry) => relative(root, join(entry.parentPath, entry.name)));
}

/** The packages a file imports (static, dynamic, `export … from`, `require`), by package name. */
function packagesOf(file: string): string[] {
  const text = readFileSync(join(root, file), "utf-8");
  const specifiers = [...text.matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+|\brequire\s*\(\s*)["']([^"']+)["']/g)].map((m) => m[1]!);
  return specifiers
    .filter((s) => !s.startsWith(".") && !s.startsWith("node:"))
    .map((s) => s.split("/").slice(0, s.startsWith("@") ? 2 : 1).join("/"));
}

const peers = Object.keys(manifest.peerDependencies);
const declared = new Set([manifest.name, ...peers, ...Object.keys(manifest.devDependencies)]);

describe("imports", () => {
  it("of src are only the optional peers", () => {
    const found = files("src").flatMap((file) => packagesOf(file).map((name) => `${file}: ${name}`));
    expect(found.filter((line) => !peers.includes(line.split(": ")[1]!))).toEqual([]);
    expect(found.some((line) => line.endsWith(": @openai/agents"))).toBe(true); // the scan sees them
  });

  it("of the examples and tests are declared packages, never a hoisted dependency of one", () => {
    const found = [...files("examples"), ...files("test")].flatMap((file) => packagesOf(file).map((name) => `${file}: ${name}`));
    expect(found.filter((line) => !declared.has(line.split(": ")[1]!))).toEqual([]);
    expect(found.filter((line) => line.includes("@openai/agents-"))).toEqual([]);
    expect(found).toContain("examples/openai-agents.ts: @openai/agents");
  });

  it("of peers are each installed here to test against, and optional for users", () => {
    for (const peer of peers) expect(manifest.devDependencies[peer], peer).toBeDefined();
    expect(Object.keys((manifest as { peerDependenciesMeta?: object }).peerDependenciesMeta ?? {}).sort()).toEqual([...peers].sort());
  });
});
