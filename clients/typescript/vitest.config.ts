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
    // The suites of test/ (the harness's run); SAGA_VITEST_INCLUDE runs others, e.g. the ones in
    // test/with-policies/ that need policies their pytest test loads first.
    include: process.env["SAGA_VITEST_INCLUDE"] ? [process.env["SAGA_VITEST_INCLUDE"]] : ["test/*.test.ts"],
    // One live server, one worker: the suites run one file at a time.
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 180_000,
  },
});
