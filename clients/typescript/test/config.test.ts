/** A client constructed with a URL or key it can never work with fails at once, naming the option —
 * not at its first call (a `TypeError` from an unset URL), nor after retrying an unparsable URL as
 * an unreachable server. No live server needed. */
import { describe, expect, it, vi } from "vitest";

import { CLIENT_CODES, Saga, SagaConfigError, SagaError, type SagaOptions } from "../src/index.js";

/** `new Saga(options)`'s error, with a `fetch` that fails the test if anything was sent. */
function refusal(options: Partial<Record<keyof SagaOptions, unknown>>): SagaConfigError {
  const fetch = vi.fn(() => Promise.reject(new Error("nothing may be sent")));
  try {
    new Saga({ ...options, fetch } as unknown as SagaOptions);
  } catch (error) {
    expect(fetch).not.toHaveBeenCalled();
    expect(error).toBeInstanceOf(SagaConfigError);
    expect(error).toBeInstanceOf(SagaError);
    return error as SagaConfigError;
  }
  throw new Error(`new Saga(${JSON.stringify(options)}) did not throw`);
}

describe("the server's URL", () => {
  it("unset (an unset SAGA_URL passed on) is refused by the constructor, naming the option and the variable", () => {
    const error = refusal({ url: process.env["SAGA_ADMIN_CLIENT_UNSET_VARIABLE"], key: "sk_test" });
    expect([error.name, error.code, error.option]).toEqual(["SagaConfigError", "invalid_config", "url"]);
    expect(error.message).toBe(
      "Saga: the server's URL (option `url`) is undefined (not set): pass it, e.g. `new Saga({ url: process.env.SAGA_URL, ... })` " +
        "with SAGA_URL set to https://saga.example.com.",
    );
    expect(refusal({ key: "sk_test" }).option).toBe("url");
    expect(refusal({ url: "", key: "sk_test" }).message).toMatch(/option `url`\) is empty/);
    expect(refusal({ url: "  ", key: "sk_test" }).message).toMatch(/option `url`\) is empty/);
    expect(refusal({ url: null, key: "sk_test" }).message).toMatch(/option `url`\) is null/);
    expect(refusal({ url: 8000, key: "sk_test" }).message).toMatch(/option `url`\) is a number, not a string/);
  });

  it("that does not parse is refused at once, not retried as an unreachable server", () => {
    const error = refusal({ url: "saga.example.com", key: "sk_test" });
    expect([error.code, error.option]).toEqual(["invalid_config", "url"]);
    expect(error.message).toBe(
      'Saga: the server\'s URL (option `url`, e.g. SAGA_URL) "saga.example.com" is not a URL: give it with its scheme and host, e.g. https://saga.example.com.',
    );
    expect(refusal({ url: "http://", key: "sk_test" }).message).toMatch(/"http:\/\/" is not a URL/);
  });

  it("that is not http(s) is refused", () => {
    expect(refusal({ url: "localhost:8000", key: "sk_test" }).message).toBe(
      'Saga: the server\'s URL (option `url`, e.g. SAGA_URL) "localhost:8000" is not an http(s) URL: e.g. https://saga.example.com.',
    );
    expect(refusal({ url: "ftp://saga.example.com", key: "sk_test" }).option).toBe("url");
  });

  it("that is fine is taken, with or without /api/v1", () => {
    expect(new Saga({ url: "https://saga.example.com/", key: "sk_test" }).apiUrl).toBe("https://saga.example.com/api/v1");
    expect(new Saga({ url: "http://127.0.0.1:8000/api/v1", key: "sk_test" }).apiUrl).toBe("http://127.0.0.1:8000/api/v1");
  });
});

describe("the key", () => {
  it("unset or empty is refused by the constructor, naming the option and the variable", () => {
    const error = refusal({ url: "https://saga.example.com" });
    expect([error.code, error.option]).toEqual(["invalid_config", "key"]);
    expect(error.message).toBe(
      "Saga: the API key (option `key`) is undefined (not set): pass an agent key, e.g. `new Saga({ key: process.env.SAGA_AGENT_KEY, ... })` " +
        "with SAGA_AGENT_KEY set (manage.py create_agent_key --tenant SLUG --name NAME).",
    );
    expect(refusal({ url: "https://saga.example.com", key: "" }).message).toMatch(/option `key`\) is empty/);
  });
});

it("invalid_config is one of the spec's client codes", () => {
  expect(CLIENT_CODES).toContain("invalid_config");
});
