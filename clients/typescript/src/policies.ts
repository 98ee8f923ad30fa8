/**
 * The tenant's tool policies as the client keeps them (`GET /policies`), and which one governs a
 * tool — the server's precedence (`ledger/policies/resolve.py`): an exact name beats a glob; then
 * the tenant's own policy beats the global one; among globs, the one with more literal characters
 * wins (`crm.update_*` beats `crm.*`). Globs are Python's `fnmatch` ones: `*`, `?`, `[seq]`, `[!seq]`.
 *
 * The copy is kept current cheaply: the answer and its `ETag` are kept, and at most every
 * `refreshS` seconds (the client's `policyRefreshS`, when a step needs it) it is revalidated with `If-None-Match`; 304 keeps it.
 */
import type { Api } from "./api.js";
import type { BeforeRead } from "./images.js";
import type { Policies } from "./types.js";

export type ToolPolicy = Policies["policies"][number];

export function isGlob(pattern: string): boolean {
  return /[*?[]/.test(pattern);
}

const globs = new Map<string, RegExp>();

/** A Python `fnmatch` pattern as a RegExp (`fnmatch.translate`, case-sensitive). */
export function globRegExp(pattern: string): RegExp {
  const cached = globs.get(pattern);
  if (cached) return cached;
  let out = "";
  let i = 0;
  const escape = (text: string): string => text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
  while (i < pattern.length) {
    const ch = pattern[i]!;
    i += 1;
    if (ch === "*") out += "[\\s\\S]*";
    else if (ch === "?") out += "[\\s\\S]";
    else if (ch === "[") {
      let j = i;
      if (j < pattern.length && pattern[j] === "!") j += 1;
      if (j < pattern.length && pattern[j] === "]") j += 1;
      while (j < pattern.length && pattern[j] !== "]") j += 1;
      if (j >= pattern.length) {
        out += "\\[";
      } else {
        let body = pattern.slice(i, j);
        i = j + 1;
        const negate = body.startsWith("!");
        if (negate) body = body.slice(1);
        // Ranges stay ranges; everything else is literal inside the class.
        const chars = body.replace(/\\/g, "\\\\").replace(/\]/g, "\\]").replace(/\^/g, "\\^");
        out += body === "" ? (negate ? "[\\s\\S]" : "(?!)") : `[${negate ? "^" : ""}${chars}]`;
      }
    } else out += escape(ch);
  }
  const compiled = new RegExp(`^(?:${out})$`, "u");
  globs.set(pattern, compiled);
  return compiled;
}

function literalLength(pattern: string): number {
  return [...pattern].filter((ch) => !"*?[]".includes(ch)).length;
}

function rank(policy: ToolPolicy): [number, number, number] {
  return [isGlob(policy.tool) ? 0 : 1, policy.scope === "tenant" ? 1 : 0, literalLength(policy.tool)];
}

function governs(policy: ToolPolicy, tool: string): boolean {
  return policy.tool === tool || (isGlob(policy.tool) && globRegExp(policy.tool).test(tool));
}

/** The most specific of `policies` that governs `tool` (the server's precedence), or undefined. */
export function policyFor(policies: readonly ToolPolicy[], tool: string): ToolPolicy | undefined {
  let best: ToolPolicy | undefined;
  let bestRank: [number, number, number] | undefined;
  for (const policy of policies) {
    if (!governs(policy, tool)) continue;
    const r = rank(policy);
    if (!bestRank || r[0] > bestRank[0] || (r[0] === bestRank[0] && (r[1] > bestRank[1] || (r[1] === bestRank[1] && r[2] > bestRank[2])))) {
      best = policy;
      bestRank = r;
    }
  }
  return best;
}

/** A policy's `before`, when it has a usable one. */
export function beforeOf(policy: ToolPolicy | undefined): BeforeRead | undefined {
  const before = policy?.before as Record<string, unknown> | null | undefined;
  if (!before || typeof before !== "object" || typeof before["tool"] !== "string" || !before["tool"]) return undefined;
  const path = before["path"];
  return { tool: before["tool"], args: before["args"] ?? {}, path: typeof path === "string" && path ? path : null };
}

/** The tenant's policies, fetched when first needed and revalidated at most every `refreshS`. */
export class PolicyCache {
  private policies: ToolPolicy[] | undefined;
  private etag = "";
  private checkedAt = -Infinity;
  private inFlight: Promise<ToolPolicy[]> | undefined;

  constructor(
    private readonly api: Api,
    /** Seconds a copy is used without asking the server again (0: ask before every step that needs it). */
    readonly refreshS: number,
  ) {}

  /** The policies, from the copy while it is fresh, else revalidated (`If-None-Match`; 304 keeps it). */
  async current(signal?: AbortSignal): Promise<ToolPolicy[]> {
    if (this.policies && (performance.now() - this.checkedAt) / 1000 < this.refreshS) return this.policies;
    // Concurrent steps share one request.
    this.inFlight ??= this.refresh(signal).finally(() => {
      this.inFlight = undefined;
    });
    return this.inFlight;
  }

  /** The policy that governs `tool`, from the current copy. */
  async policyFor(tool: string, signal?: AbortSignal): Promise<ToolPolicy | undefined> {
    return policyFor(await this.current(signal), tool);
  }

  /** Forget the copy: the next step asks the server (a policy was just loaded, say). */
  invalidate(): void {
    this.checkedAt = -Infinity;
  }

  private async refresh(signal?: AbortSignal): Promise<ToolPolicy[]> {
    const reply = await this.api.policiesIfChanged(this.policies ? this.etag : "", signal);
    this.checkedAt = performance.now();
    if (reply.status !== 304 || !this.policies) {
      const listed = (reply.data as { policies?: unknown } | null)?.policies;
      this.policies = Array.isArray(listed) ? (listed as ToolPolicy[]) : [];
      this.etag = reply.etag;
    }
    return this.policies;
  }
}
