/**
 * An OpenAI Agents SDK agent whose payment tool is a Saga step, with Saga's approval on the SDK's
 * `needsApproval`/interruption flow. The model is scripted (a `Model` of the SDK's interface that
 * answers from a script, no network): drop `model:` to use OpenAI's.
 *
 *     const saga = new Saga({ url: process.env.SAGA_URL!, key: process.env.SAGA_AGENT_KEY! });
 *     console.log(await chargeWithOpenAIAgents(saga));
 */
import { Saga } from "@saga-admin/client";
import { sagaDecisions, sagaFunctionTool } from "@saga-admin/client/openai-agents";
import { Agent, Usage, run as runAgent, setTracingDisabled, tool, type Model, type ModelRequest, type ModelResponse } from "@openai/agents";
import { z } from "zod";

/** The charges the payment provider made (what the tool did, for the example to show). */
export const charged: Array<{ customer: string; amount: number }> = [];

/** Asks for the charge, then says what came of it. */
export class ScriptedModel implements Model {
  constructor(
    private readonly customer: string,
    private readonly amount: number,
  ) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    const items = typeof request.input === "string" ? [] : request.input;
    const result = items.findLast((item) => item.type === "function_call_result");
    if (result && result.type === "function_call_result") {
      const output = result.output;
      const text = typeof output === "string" ? output : "text" in output ? String(output.text) : JSON.stringify(output);
      return {
        usage: new Usage(),
        output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: `Done: ${text}` }] }],
      };
    }
    return {
      usage: new Usage(),
      output: [
        {
          type: "function_call",
          callId: "call-1",
          name: "charge",
          status: "completed",
          arguments: JSON.stringify({ customer: this.customer, amount: this.amount, currency: "EUR" }),
        },
      ],
    };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }
}

export async function chargeWithOpenAIAgents(
  saga: Saga,
  options: { customer?: string; amount?: number } = {},
): Promise<{ runId: string; output: string; interruptions: number }> {
  setTracingDisabled(true); // no trace export: this example talks to no one but Saga Admin
  const customer = options.customer ?? "c-9";
  const amount = options.amount ?? 120;
  const charge = sagaFunctionTool(
    tool({
      name: "charge",
      description: "Charge a customer",
      parameters: z.object({ customer: z.string(), amount: z.number(), currency: z.string() }),
      execute: async ({ customer, amount }) => {
        charged.push({ customer, amount });
        return `charge ch_${charged.length}`;
      },
    }),
    { name: "payments.charge", target: (args) => ["customer", String(args["customer"])] },
  );
  const agent = new Agent({ name: "billing", instructions: "Charge customers.", model: new ScriptedModel(customer, amount), tools: [charge] });
  return saga.run({ agent: "billing", request: `Charge ${customer} the first month` }, async (run) => {
    let result = await runAgent(agent, `Charge ${customer} ${amount} EUR for the first month`);
    let interruptions = 0;
    // A gated call interrupts the run; Saga's approver decides it, then the run resumes.
    while (result.interruptions.length > 0) {
      interruptions += result.interruptions.length;
      result = await runAgent(agent, await sagaDecisions(result, { timeoutS: 60 }));
    }
    return { runId: run.id, output: String(result.finalOutput ?? ""), interruptions };
  });
}
