/**
 * `run.plan([...])` against the live server: the steps recorded in one request before any runs,
 * each then run by `run.step` with the same tool, target and args; the pivot lint and the approvals
 * of the whole plan at once; a plan sent again comes back as it is now; a refusal throws the
 * spec's error class and records nothing.
 */
import { describe, expect, it } from "vitest";

import { InvalidRequest, type PlanStepOptions } from "../src/index.js";
import { agentSaga, noServer, unique } from "./live.js";

const EMAIL = "plan@company.com";

const onboarding: PlanStepOptions[] = [
  {
    tool: "hr.create_user",
    target: ["user", EMAIL],
    args: { email: EMAIL, name: "Plan Ahead" },
    compensate: ["hr.delete_user", { email: EMAIL }],
  },
  { tool: "workspace.provision_license", target: ["user", EMAIL], args: { email: EMAIL, sku: "business-standard" } },
  { tool: "email.send_welcome", target: ["user", EMAIL], args: { to: EMAIL } },
];

describe.skipIf(noServer)("a plan", () => {
  it("is recorded up front, and its steps then run the planned actions", async () => {
    const saga = agentSaga();
    const calls: string[] = [];
    let planned: string[] = [];
    let ran: string[] = [];
    await saga.run({ agent: "onboarding", request: "Onboard, planned", externalId: unique("PLAN") }, async (run) => {
      const plan = await run.plan(onboarding);
      expect(plan.actions.map((a) => a.status)).toEqual(["planned", "planned", "planned"]);
      expect(plan.warnings).toEqual([]);
      planned = plan.actions.map((a) => a.id);
      for (const step of onboarding) {
        await run.step({ ...step, do: async () => calls.push(step.tool) });
      }
      const detail = await saga.getRun(run.id);
      ran = detail.actions.map((a) => a.id);
      expect(detail.actions.map((a) => a.status)).toEqual(["succeeded", "succeeded", "succeeded"]);
    });
    expect(calls).toEqual(["hr.create_user", "workspace.provision_license", "email.send_welcome"]);
    expect(ran).toEqual(planned);
  });

  it("is linted for pivot order, asks every approval at once, and replays as it is now", async () => {
    const saga = agentSaga();
    const run = await saga.run({ agent: "onboarding", request: "Charge, then onboard", externalId: unique("PLAN") });
    const steps: PlanStepOptions[] = [
      { tool: "payments.charge", target: ["customer", "cus_42"], args: { amount: 40 } },
      { tool: "hr.create_user", target: ["user", EMAIL], args: { email: EMAIL }, start: true },
    ];
    const plan = await run.plan(steps);
    const [charge, user] = plan.actions;
    expect([charge?.status, charge?.approval?.status]).toEqual(["awaiting_approval", "pending"]);
    expect([user?.status, user?.attempts]).toEqual(["running", 1]);
    expect(plan.warnings.map((w) => [w["code"], w["action_id"], w["pivot_action_id"]])).toEqual([
      ["pivot_order", user?.id, charge?.id],
    ]);
    const again = await run.plan(steps);
    expect(again.actions.map((a) => a.id)).toEqual(plan.actions.map((a) => a.id));
  });

  it("records nothing when the policy refuses one of its steps", async () => {
    const saga = agentSaga();
    const run = await saga.run({ agent: "onboarding", request: "A refused plan", externalId: unique("PLAN") });
    const refused = run.plan([
      onboarding[1] as PlanStepOptions,
      { tool: "hr.create_user", args: { email: EMAIL }, compensate: ["hr.delete_everyone", {}] },
    ]);
    await expect(refused).rejects.toBeInstanceOf(InvalidRequest);
    await expect(refused).rejects.toMatchObject({ code: "compensation_not_allowed", details: { plan_index: 1 } });
    expect((await saga.getRun(run.id)).actions).toEqual([]);
  });
});
