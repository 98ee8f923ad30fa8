/** The class table against the spec's rules (clients/spec/errors.json, generated into
 * src/generated/codes.ts): a class the rules name that the client does not have fails loudly when
 * the module loads, never quietly becoming the default class. No live server needed. */
import { afterEach, describe, expect, it, vi } from "vitest";

import { Conflict, InvalidRequest, NotFound, RunArchived, checkClassRules, errorFromAnswer } from "../src/errors.js";
import { CLASS_RULES, DEFAULT_CLASS } from "../src/generated/codes.js";

afterEach(() => {
  vi.doUnmock("../src/generated/codes.js");
  vi.resetModules();
});

describe("the spec's class rules", () => {
  it("name only classes the client has (this module loaded)", () => {
    expect(CLASS_RULES.length).toBeGreaterThan(0);
    expect(() => checkClassRules(CLASS_RULES, DEFAULT_CLASS, { Conflict, InvalidRequest })).toThrow(/RunCancelled/);
  });

  it("with a misspelt class are refused, naming it", () => {
    const rules = [{ className: "Conflcit", status: [409] }];
    expect(() => checkClassRules(rules, "InvalidRequest", { Conflict, InvalidRequest })).toThrow(
      'clients/spec/errors.json names the error class "Conflcit", which the TypeScript client does not have (it has Conflict, InvalidRequest).',
    );
    expect(() => checkClassRules([], "InvalidRequst", { Conflict, InvalidRequest })).toThrow(/"InvalidRequst"/);
    expect(() => checkClassRules([{ className: "toString" }], "InvalidRequest", { InvalidRequest })).toThrow(/"toString"/);
  });

  it("with a misspelt class make importing the client fail", async () => {
    vi.resetModules();
    vi.doMock("../src/generated/codes.js", async (original) => {
      const real = await original<typeof import("../src/generated/codes.js")>();
      return { ...real, CLASS_RULES: [...real.CLASS_RULES, { className: "NotFuond", status: [404] }] };
    });
    await expect(import("../src/errors.js")).rejects.toThrow(/"NotFuond"/);
  });
});

describe("an archived run", () => {
  it("is RunArchived, a kind of NotFound, with where and when", () => {
    const body = JSON.stringify({
      error: {
        code: "archived",
        message: "Run run_1 was archived.",
        details: { archive: "s3://saga-archive/acme/run_1.manifest.json", archived_at: "2026-11-27T08:00:00+00:00" },
      },
    });
    const error = errorFromAnswer(410, "Gone", body, "req_1");
    expect(error).toBeInstanceOf(RunArchived);
    expect(error).toBeInstanceOf(NotFound);
    const archived = error as RunArchived;
    expect([archived.status, archived.code, archived.archive, archived.archivedAt]).toEqual([
      410,
      "archived",
      "s3://saga-archive/acme/run_1.manifest.json",
      "2026-11-27T08:00:00+00:00",
    ]);
  });
});
