/** The language-neutral vectors (`clients/spec/vectors`), which the server and the Python client pass too. */
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";

import { ApprovalRejected, Saga, computeSignature, deriveSecret, errorFromAnswer, rejectionFor, signedHeaders, stepKey, verifySignature } from "../src/index.js";
import { canonical, completeKey, ackKey, failKey, startKey, succeedKey } from "../src/keys.js";

const spec = (name: string): any => JSON.parse(readFileSync(new URL(`../../spec/vectors/${name}.json`, import.meta.url), "utf8"));
const signatures = spec("signatures");
const keys = spec("keys");
const errors = spec("errors");

describe("signatures", () => {
  it.each(signatures.signing as any[])("signs $name", (v) => {
    expect(computeSignature(v.secret, v.timestamp, v.body)).toBe(v.expected_signature);
    const headers = signedHeaders(v.secret, Buffer.from(v.body, "utf8"), v.timestamp);
    expect(headers).toEqual({ "X-Saga-Timestamp": String(v.timestamp), "X-Saga-Signature": v.expected_signature });
    expect(verifySignature(v.secret, headers, v.body, { now: v.timestamp })).toBe(true);
  });
  it.each(signatures.derive_secret as any[])("derives the secret of $context", (v) => {
    expect(deriveSecret(v.master, v.context)).toBe(v.expected);
  });
  it.each(signatures.verify as any[])("verifies: $name", (v) => {
    const verdict = verifySignature(v.secret, v.headers, Buffer.from(v.body, "utf8"), { toleranceS: v.tolerance_s, now: v.now, url: v.url });
    expect(verdict).toBe(v.valid);
  });
  it("takes a Headers object too", () => {
    const v = (signatures.verify as any[]).find((x) => x.valid && x.url === null);
    expect(verifySignature(v.secret, new Headers(v.headers), v.body, { toleranceS: v.tolerance_s, now: v.now })).toBe(true);
  });
});

describe("idempotency keys", () => {
  it.each(keys.step_keys as any[])("derives the step key: $name", (v) => {
    expect(canonical([v.run_id, v.tool, v.target, v.args])).toBe(v.canonical);
    expect(stepKey(v.run_id, v.tool, v.target, v.args)).toBe(v.expected);
  });
  it.each(keys.action_keys as any[])("derives an action's keys", (v) => {
    expect([startKey(v.action), succeedKey(v.action), failKey(v.action)]).toEqual([v.start, v.succeed, v.fail]);
  });
  it("derives run and command keys", () => {
    for (const v of keys.run_keys) expect(completeKey(v.run_id)).toBe(v.complete);
    for (const v of keys.command_keys) expect(ackKey(v.command_id)).toBe(v.ack);
  });
});

describe("error answers", () => {
  it.each(errors.answers as any[])("reads $name", (v) => {
    const error = errorFromAnswer(v.status, v.reason, v.body, v.headers["X-Request-Id"] ?? "");
    expect(error.constructor.name).toBe(v.expected.class);
    expect([error.code, error.message, error.details, error.requestId]).toEqual([
      v.expected.code,
      v.expected.message,
      v.expected.details,
      v.expected.request_id,
    ]);
  });

  it.each(errors.answers as any[])("retries what the spec retries: $name", async (v) => {
    let calls = 0;
    const answer = async (): Promise<Response> => {
      calls += 1;
      return new Response(v.body || null, { status: v.status, statusText: v.reason, headers: v.headers });
    };
    const saga = new Saga({ url: "http://saga.invalid", key: "sk_test", retries: 1, backoffS: 0, fetch: answer });
    await expect(saga.getRun("run_1")).rejects.toHaveProperty("code", v.expected.code);
    expect(calls).toBe(v.expected.retried ? 2 : 1);
  });
});

describe("rejections", () => {
  it.each(errors.rejections as any[])("raises $name", (v) => {
    const rejected = rejectionFor(v.action);
    expect(rejected.constructor.name).toBe(v.expected.class);
    expect(rejected instanceof ApprovalRejected).toBe(v.expected.is_rejection);
    expect([rejected.code, rejected.reason, rejected.message]).toEqual([v.expected.code, v.expected.reason, v.expected.message]);
  });
});
