/**
 * Taking a step's before- and after-image for it, as its policy says (`before`: a read tool, its
 * args as templates of the call, a path into its result): the registered reader of the read tool
 * is called with the filled args before the step is recorded (the before-image goes with the
 * record) and again after `do` succeeded (the after-image goes with the success). The images
 * follow `images.ts`'s rules, the server's.
 *
 * A reader is what the client calls for a read tool: `saga.reader(tool, fn)` names one; a
 * `saga.tool(name, fn)` and an adapter's wrapped tool (`sagaTool`, `sagaFunctionTool`) of that
 * name serve too, so an agent that has its read tools among its tools needs no change.
 */
import { BeforeImageFailed } from "./errors.js";
import { type BeforeRead, NoImage, TemplateUnfillable, fillBeforeArgs, imageAt, resultOfRead } from "./images.js";
import { type PolicyCache, beforeOf } from "./policies.js";
import type { Target } from "./types.js";

/** What a reader receives beside the read's args. */
export interface ReadContext {
  /** The read tool (the policy's `before.tool`). */
  tool: string;
  /** The step whose image is taken. */
  step: string;
  /** "before": before the step is recorded; "after": once `do` succeeded. */
  phase: "before" | "after";
  /** The run's signal. */
  signal: AbortSignal;
  /** An adapter's framework context of the step's call (what the adapters hand their tools). */
  host?: unknown;
}

/**
 * Reads the current state for a read tool: gets the filled args and returns the read's result —
 * a JSON value, an MCP tool result (`structuredContent`, or one text block with a JSON object;
 * `isError` fails the read), or a string holding a JSON object.
 */
export type Reader = (args: Record<string, unknown>, context: ReadContext) => unknown;

// The readers the tools this process wrapped serve (`saga.tool` of any client, the adapters'), by
// Saga tool name: one map per process (as the active run), so the ESM and CommonJS builds see
// each other's.
const TOOL_READERS = Symbol.for("@saga-admin/client.tool-readers");
const toolReaders = ((globalThis as { [TOOL_READERS]?: Map<string, Reader> })[TOOL_READERS] ??= new Map<string, Reader>());

/** A wrapped tool of this Saga name serves as the reader for it (the most recently wrapped wins). */
export function registerToolReader(tool: string, reader: Reader): void {
  toolReaders.set(tool, reader);
}

/** A step's planned read: its policy's `before` and the filled args. */
export interface PlannedRead {
  step: string;
  before: BeforeRead;
  args: Record<string, unknown>;
}

export class BeforeImages {
  /** Readers named with `saga.reader(tool, fn)` (these win over the tools'). */
  readonly readers = new Map<string, Reader>();

  constructor(readonly policies: PolicyCache) {}

  /** The reader the client calls for `tool`: `saga.reader`'s, else the newest tool of that name's. */
  readerFor(tool: string): Reader | undefined {
    return this.readers.get(tool) ?? toolReaders.get(tool);
  }

  /**
   * The read a step of `tool` with these args needs (undefined: its policy has no `before`).
   * Args the call cannot fill refuse the step (`BeforeImageFailed`).
   */
  async planned(tool: string, args: unknown, target: Target | null | undefined, signal?: AbortSignal): Promise<PlannedRead | undefined> {
    const before = beforeOf(await this.policies.policyFor(tool, signal));
    if (!before) return undefined;
    let filled: unknown;
    try {
      filled = fillBeforeArgs(before.args, {
        args,
        ...(target ? { targetType: String(target[0]), targetId: String(target[1]) } : {}),
      });
    } catch (error) {
      if (!(error instanceof TemplateUnfillable)) throw error;
      throw new BeforeImageFailed(tool, before.tool, `its args cannot be filled: ${error.message}`, { cause: error });
    }
    const readArgs = typeof filled === "object" && filled !== null && !Array.isArray(filled) ? (filled as Record<string, unknown>) : {};
    return { step: tool, before, args: readArgs };
  }

  /** The image the read gives now, or `BeforeImageFailed` naming the read and why. */
  async take(read: PlannedRead, phase: "before" | "after", signal: AbortSignal, host?: unknown): Promise<unknown> {
    const name = read.before.tool;
    const reader = this.readerFor(name);
    if (!reader) {
      throw new BeforeImageFailed(
        read.step,
        name,
        `no reader is registered for ${name}: register one with saga.reader("${name}", fn) or wrap the read as a tool of that name, or give the step before`,
      );
    }
    let value: unknown;
    try {
      value = await reader(structuredClone(read.args), { tool: name, step: read.step, phase, signal, ...(host !== undefined ? { host } : {}) });
    } catch (error) {
      if (signal.aborted && error === signal.reason) throw error;
      throw new BeforeImageFailed(read.step, name, describe(error), { cause: error });
    }
    try {
      return imageAt(resultOfRead(value), read.before.path);
    } catch (error) {
      throw new BeforeImageFailed(read.step, name, error instanceof NoImage ? error.message : describe(error), { cause: error });
    }
  }
}

function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
