/**
 * Idempotency keys, derived exactly as `clients/spec/vectors/keys.json` specifies (the Python
 * client derives the same): the same step in the same run always gets the same key, so a retried
 * step — in this process or after a restart — replays instead of acting twice.
 */
import { createHash } from "node:crypto";

import type { Target } from "./types.js";

function byCodePoint(a: string, b: string): number {
  const left = Array.from(a);
  const right = Array.from(b);
  for (let i = 0; i < Math.min(left.length, right.length); i++) {
    const x = left[i]!.codePointAt(0)!;
    const y = right[i]!.codePointAt(0)!;
    if (x !== y) return x - y;
  }
  return left.length - right.length;
}

function sorted(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sorted);
  if (value !== null && typeof value === "object") {
    const source = value as Record<string, unknown>;
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(source).sort(byCodePoint)) {
      if (source[key] !== undefined) out[key] = sorted(source[key]);
    }
    return out;
  }
  return value;
}

/** Canonical JSON: keys sorted by code point, no whitespace, non-ASCII as itself. */
export function canonical(value: unknown): string {
  return JSON.stringify(sorted(value));
}

/** `run_id:` + the first 40 hex digits of SHA-256(canonical([runId, tool, target|null, args])). */
export function stepKey(runId: string, tool: string, target: Target | null | undefined, args: unknown): string {
  const text = canonical([runId, tool, target ? [target[0], target[1]] : null, args]);
  return `${runId}:${createHash("sha256").update(text, "utf8").digest("hex").slice(0, 40)}`;
}

export interface KeyedAction {
  readonly idempotency_key: string;
  readonly attempts: number;
}

/** One key per attempt, shared by every caller of the same action. */
export const startKey = (action: KeyedAction): string => `${action.idempotency_key}:start:${action.attempts + 1}`;
export const succeedKey = (action: KeyedAction): string => `${action.idempotency_key}:succeed:${action.attempts}`;
export const failKey = (action: KeyedAction): string => `${action.idempotency_key}:fail:${action.attempts}`;
export const completeKey = (runId: string): string => `complete-${runId}`;
export const ackKey = (commandId: string): string => `ack-${commandId}`;
