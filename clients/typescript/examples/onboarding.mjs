// The onboarding saga: three steps, each with what undoes it. `node examples/onboarding.mjs` with
// SAGA_URL and SAGA_AGENT_KEY set; FAIL_MAIL=1 makes the third step fail, so the run lands in the
// recovery queue and an operator can undo the first two (newest first).
import { Saga } from "@saga-admin/client";

const saga = new Saga({ url: process.env.SAGA_URL, key: process.env.SAGA_AGENT_KEY });
const email = "ashu@company.com";
const hr = { createUser: async ({ email, name }) => ({ user_id: 17, email, name }) };
const workspace = { provision: async ({ sku }) => ({ license: `lic-${sku}` }) };
const mail = {
  sendWelcome: async () => {
    if (process.env.FAIL_MAIL) throw new Error("SMTP 451: try again later");
    return { message_id: "m-1" };
  },
};

try {
  await saga.run({ agent: "onboarding", request: "Onboard Ashu Kumar", externalId: "HR-17" }, async (run) => {
    const user = await run.step({
      tool: "hr.create_user", target: ["user", email], args: { email, name: "Ashu Kumar" },
      do: (args) => hr.createUser(args), compensate: ["hr.delete_user", { email }],
    });
    await run.step({
      tool: "workspace.provision_license", target: ["user", email], args: { email, sku: "business-standard" },
      do: (args) => workspace.provision(args), compensate: ["workspace.cancel_license", { email }],
    });
    await run.checkpoint("accounts-ready", { state: { user_id: user.user_id }, summary: "Ashu has an account and a license." });
    await run.step({ tool: "email.send_welcome", target: ["user", email], args: { to: email }, do: () => mail.sendWelcome() });
    console.log(`run ${run.id} completed`);
  });
} catch (error) {
  console.log(`run failed into the recovery queue: ${error.message}`);
  process.exitCode = 1;
}
