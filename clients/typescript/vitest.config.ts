import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

const src = (path: string): string => fileURLToPath(new URL(`./src/${path}`, import.meta.url));

export default defineConfig({
  resolve: {
    // The examples import the package by its name; here that is its source.
    alias: [
      { find: /^@saga-admin\/client$/, replacement: src("index.ts") },
      { find: /^@saga-admin\/client\/ai$/, replacement: src("adapters/ai.ts") },
      { find: /^@saga-admin\/client\/openai-agents$/, replacement: src("adapters/openai-agents.ts") },
    ],
  },
  test: {
    include: ["test/**/*.test.ts"],
    // One live server, one worker: the suites run one file at a time.
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 180_000,
  },
});
