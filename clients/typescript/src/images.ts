/**
 * Before- and after-images: the value an update replaced, read for the agent (API.md,
 * "Before-images and verified undo"). The rules are the server's (`ledger/policies/before_images.py`)
 * and the Python client's, fixed by `clients/spec/vectors/before_images.json`:
 *
 * - a policy's `before.args` are filled from the call: `$args.<path>` (list items by index),
 *   `$args`, `$target_id`, `$target_type`; `$$…` is the literal `$…`; other values are kept;
 * - a read's **result** is its structured content, else its single text block when that text is a
 *   JSON object (`readResult`);
 * - the **image** is the value at `before.path` in the result, the whole result without one; a
 *   missing or null value is no image (`imageAt`);
 * - two images are **equal** as JSON values: member order ignored, numbers by value, a boolean is
 *   not a number (`imagesEqual`).
 */

/** A read gave no image: no result, a result that is not a JSON object, or nothing at `path`. */
export class NoImage extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NoImage";
  }
}

/** A `before.args` template the call does not have; `path` is the template as written. */
export class TemplateUnfillable extends Error {
  constructor(
    readonly path: string,
    why: string,
  ) {
    super(`${path}: ${why}`);
    this.name = "TemplateUnfillable";
  }
}

/** A policy's `before`: the read that takes a call's images. */
export interface BeforeRead {
  /** The read tool (its own policy is `read_only`). */
  tool: string;
  /** Templates of the read's args. */
  args?: unknown;
  /** A dotted path into the read's result (list items by index); none: the whole result. */
  path?: string | null;
}

const TEMPLATE = /^\$(?:(?<root>args)(?<path>(?:\.[^.\s$]+)*)|(?<target>target_id|target_type))$/;

type Json = unknown;

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function segmentOf(value: unknown, segment: string): { found: true; value: unknown } | { found: false } {
  if (isObject(value) && Object.hasOwn(value, segment)) return { found: true, value: value[segment] };
  if (Array.isArray(value) && /^[0-9]+$/.test(segment) && Number(segment) < value.length) {
    return { found: true, value: value[Number(segment)] };
  }
  return { found: false };
}

/**
 * The read's args: `template` (a policy's `before.args`) filled from the call. Throws
 * `TemplateUnfillable` naming the first template the call cannot fill.
 */
export function fillBeforeArgs(template: unknown, call: { args: unknown; targetId?: string; targetType?: string }): Json {
  const fill = (value: unknown): unknown => {
    if (Array.isArray(value)) return value.map(fill);
    if (isObject(value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fill(v)]));
    if (typeof value !== "string" || !value.startsWith("$")) return value;
    if (value.startsWith("$$")) return value.slice(1);
    const match = TEMPLATE.exec(value);
    if (!match?.groups) {
      throw new TemplateUnfillable(value, "cannot be filled before the call; use $args.<path>, $target_id or $target_type (write $$ for a literal $)");
    }
    const target = match.groups["target"];
    if (target) {
      const known = target === "target_id" ? call.targetId : call.targetType;
      if (!known) throw new TemplateUnfillable(value, `the call has no ${target}`);
      return known;
    }
    let found: unknown = call.args;
    if (found === null || found === undefined) throw new TemplateUnfillable(value, "the call has no args");
    for (const segment of (match.groups["path"] ?? "").split(".").slice(1)) {
      const next = segmentOf(found, segment);
      if (!next.found) throw new TemplateUnfillable(value, `the call's args have no '${segment}' there`);
      found = next.value;
    }
    return found;
  };
  return fill(template ?? {});
}

/**
 * A read's result as JSON: its structured content when it has one, else its single text block
 * when that text is a JSON object. Throws `NoImage` (saying why) otherwise.
 */
export function readResult(structured: unknown, texts: readonly string[]): Json {
  if (structured !== null && structured !== undefined) return structured;
  if (texts.length !== 1) {
    throw new NoImage(
      "the read returned no structured content and " + (texts.length === 0 ? "no text" : `${texts.length} text blocks, not one JSON object`),
    );
  }
  let value: unknown;
  try {
    value = JSON.parse(texts[0]!);
  } catch {
    throw new NoImage("the read's text is not JSON (and it returned no structured content)");
  }
  if (!isObject(value)) throw new NoImage(`the read's text is JSON but not an object (${Array.isArray(value) ? "an array" : typeof value})`);
  return value;
}

/**
 * The image: the value at the dotted `path` in `result` (list items by index), or the whole
 * result without a path. Throws `NoImage` naming the first segment that is missing, or a null.
 */
export function imageAt(result: unknown, path?: string | null): Json {
  let value = result;
  let walked = "";
  for (const segment of path ? path.split(".") : []) {
    walked = walked ? `${walked}.${segment}` : segment;
    const next = segmentOf(value, segment);
    if (!next.found) throw new NoImage(`the read's result has no '${walked}'`);
    value = next.value;
  }
  if (value === null || value === undefined) throw new NoImage(path ? `the read's result has null at '${path}'` : "the read returned null");
  return value;
}

/** Whether two images are the same JSON value (object member order ignored, numbers by value). */
export function imagesEqual(left: unknown, right: unknown): boolean {
  if (typeof left === "number" || typeof right === "number") {
    // NaN equals nothing, not even itself; a boolean or a numeric string is not a number.
    return typeof left === "number" && typeof right === "number" && left === right;
  }
  if (left === null || right === null || typeof left !== "object" || typeof right !== "object") return left === right;
  if (Array.isArray(left) || Array.isArray(right)) {
    return Array.isArray(left) && Array.isArray(right) && left.length === right.length && left.every((v, i) => imagesEqual(v, right[i]));
  }
  const a = left as Record<string, unknown>;
  const b = right as Record<string, unknown>;
  const keys = Object.keys(a);
  return keys.length === Object.keys(b).length && keys.every((k) => Object.hasOwn(b, k) && imagesEqual(a[k], b[k]));
}

/**
 * What a reader function returned, as a read's result: an MCP tool result (`structuredContent`,
 * `content` text blocks; `isError` is a failed read) by the rule above; a string as one text
 * block; any other value as the result itself.
 */
export function resultOfRead(value: unknown): Json {
  if (typeof value === "string") return readResult(null, [value]);
  if (isMcpResult(value)) {
    if (value["isError"] === true) {
      const text = textBlocks(value).join(" ").slice(0, 500);
      throw new Error(`the read answered with a tool error${text ? `: ${text}` : ""}`);
    }
    return readResult(value["structuredContent"], textBlocks(value));
  }
  if (value === undefined) throw new NoImage("the read returned nothing");
  return value;
}

const MCP_KEYS = new Set(["content", "structuredContent", "isError", "_meta"]);

function isMcpResult(value: unknown): value is Record<string, unknown> {
  if (!isObject(value) || !Object.keys(value).every((k) => MCP_KEYS.has(k))) return false;
  const content = value["content"];
  if (!("structuredContent" in value) && !Array.isArray(content)) return false;
  return content === undefined || (Array.isArray(content) && content.every((block) => isObject(block) && typeof block["type"] === "string"));
}

function textBlocks(value: Record<string, unknown>): string[] {
  const content = Array.isArray(value["content"]) ? (value["content"] as Array<Record<string, unknown>>) : [];
  return content.filter((block) => block["type"] === "text" && typeof block["text"] === "string").map((block) => block["text"] as string);
}
