/**
 * The live server these tests run against: the repository's pytest harness
 * (`tests/client_ts/test_typescript_client.py`) starts it with a real RQ worker and compensating
 * webhooks, creates the keys, and passes them in the environment.
 */
import { Saga, type SagaOptions } from "../src/index.js";

export const live = {
  url: process.env["SAGA_URL"] ?? "",
  agentKey: process.env["SAGA_AGENT_KEY"] ?? "",
  operatorKey: process.env["SAGA_OPERATOR_KEY"] ?? "",
  approverKey: process.env["SAGA_APPROVER_KEY"] ?? "",
};

/** Without a server (a plain `npx vitest run`), the live suites are skipped; the harness refuses skips. */
export const noServer = !live.url;

export function agentSaga(options: Partial<SagaOptions> = {}): Saga {
  return new Saga({ url: live.url, key: live.agentKey, pollIntervalS: 0.05, maxPollIntervalS: 0.2, backoffS: 0.01, ...options });
}

export const operator = (): Saga => new Saga({ url: live.url, key: live.operatorKey });
export const approver = (): Saga => new Saga({ url: live.url, key: live.approverKey });

/** Poll `probe` until it returns a value (not undefined/false), or fail after `timeoutS`. */
export async function waitFor<T>(probe: () => Promise<T | undefined | false>, what: string, timeoutS = 90): Promise<T> {
  const deadline = performance.now() + timeoutS * 1000;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== false) return value;
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutS}s waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The pending approval of a run's action of this tool, once the step recorded it. */
export async function pendingApproval(saga: Saga, runId: () => string, tool: string): Promise<string> {
  return waitFor(async () => {
    if (!runId()) return undefined;
    for await (const action of saga.listActions(runId())) {
      if (action.tool === tool && action.status === "awaiting_approval" && action.approval?.id) return action.approval.id;
    }
    return undefined;
  }, `an approval of ${tool}`);
}

export function unique(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}
