/**
 * The rule a run ends by when its agent carried on past a failed call: a call that failed and was
 * not later retried successfully with the same arguments fails the run, so it lands in the recovery
 * queue. `saga-mcp` ends a session by it (the Python client's `saga_client._failures`, the same
 * rule); the adapters (`@saga-admin/client/ai`, `@saga-admin/client/openai-agents`), whose
 * frameworks hand a tool's error to the model and go on, end their runs by it.
 */
import { canonical } from "./keys.js";

export class UnretriedFailures {
  /** By canonical `[tool, args]`: the failed call's action id and what went wrong. */
  private readonly failed = new Map<string, { actionId: string; message: string }>();

  failedCall(tool: string, args: unknown, actionId: string, message: string): void {
    const key = canonical([tool, args ?? {}]);
    this.failed.delete(key); // the latest failure is the last one named
    this.failed.set(key, { actionId, message });
  }

  succeededCall(tool: string, args: unknown): void {
    this.failed.delete(canonical([tool, args ?? {}]));
  }

  get size(): number {
    return this.failed.size;
  }

  /**
   * Undefined when the run may complete; else the failure report (`ended`: what ended it) and the
   * last such call's action.
   */
  verdict(ended: string): { report: string; actionId: string } | undefined {
    const last = [...this.failed.values()].at(-1);
    if (!last) return undefined;
    const report = `${ended} after ${this.failed.size} failed call(s) that were not retried successfully with the same arguments; the last: ${last.message}`;
    return { report: report.slice(0, 20000), actionId: last.actionId };
  }
}
