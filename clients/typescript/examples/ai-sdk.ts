/**
 * A Vercel AI SDK agent whose payment tool is a Saga step, with Saga's approval on the SDK's own
 * tool-approval flow. The model is scripted (`ai/test`'s MockLanguageModelV3): put yours in its place.
 *
 *     const saga = new Saga({ url: process.env.SAGA_URL!, key: process.env.SAGA_AGENT_KEY! });
 *     console.log(await chargeWithTheAiSdk(saga));
 */
import { Saga } from "@saga-admin/client";
import { sagaApprovals, sagaTool } from "@saga-admin/client/ai";
import { generateText, tool, type LanguageModel, type ModelMessage } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";

/** The charges the payment provider made (what the tool did, for the example to show). */
export const charged: Array<{ customer: string; amount: number }> = [];

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

/** A model that asks for the charge, then says what came of it. */
export function scriptedModel(customer: string, amount: number): LanguageModel {
  return new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      const last = prompt.at(-1);
      if (last?.role === "tool") {
        const part = last.content.find((p) => p.type === "tool-result");
        const output = part && part.type === "tool-result" ? part.output : undefined;
        const text =
          output?.type === "execution-denied" ? `Not charged: ${output.reason ?? "denied"}` : `Charged: ${JSON.stringify(output?.value ?? null)}`;
        return { content: [{ type: "text", text }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
      }
      return {
        content: [{ type: "tool-call", toolCallId: "call-1", toolName: "charge", input: JSON.stringify({ customer, amount, currency: "EUR" }) }],
        finishReason: { unified: "tool-calls", raw: undefined },
        usage,
        warnings: [],
      };
    },
  });
}

export async function chargeWithTheAiSdk(
  saga: Saga,
  options: { customer?: string; amount?: number; model?: LanguageModel } = {},
): Promise<{ runId: string; text: string; approvalRequests: number }> {
  const customer = options.customer ?? "c-9";
  const amount = options.amount ?? 120;
  const tools = {
    charge: sagaTool(
      "payments.charge",
      tool({
        description: "Charge a customer",
        inputSchema: z.object({ customer: z.string(), amount: z.number(), currency: z.string() }),
        execute: async ({ customer, amount }) => {
          charged.push({ customer, amount });
          return { charge_id: `ch_${charged.length}` };
        },
      }),
      { target: (args) => ["customer", String(args["customer"])] },
    ),
  };
  const model = options.model ?? scriptedModel(customer, amount);
  return saga.run({ agent: "billing", request: `Charge ${customer} the first month` }, async (run) => {
    const messages: ModelMessage[] = [{ role: "user", content: `Charge ${customer} ${amount} EUR for the first month` }];
    let result = await generateText({ model, tools, messages });
    messages.push(...result.response.messages);
    let approvalRequests = 0;
    // A gated call comes back as the SDK's approval request; Saga's approver decides it.
    while (result.content.some((part) => part.type === "tool-approval-request")) {
      approvalRequests += result.content.filter((part) => part.type === "tool-approval-request").length;
      messages.push(await sagaApprovals(result.content, tools, { timeoutS: 60 }));
      result = await generateText({ model, tools, messages });
      messages.push(...result.response.messages);
    }
    return { runId: run.id, text: result.text, approvalRequests };
  });
}
