/**
 * What a step's args may be, checked by the compiler only (`tsconfig.types.json`: `strict` and
 * `exactOptionalPropertyTypes`, as many integrators compile): an `interface` is as good as a type
 * alias for `run.step`, `saga.tool` and the AI SDK adapter, while what is not a JSON object —
 * a primitive, `null`, an array, a function — does not compile. Never run: the calls are inside
 * functions nobody calls. `npm run typecheck` and `tests/client_ts` compile it.
 */
import { Saga, type Run, type SagaTool, type StepOptions } from "@saga-admin/client";
import { sagaTool } from "@saga-admin/client/ai";
import { sagaFunctionTool } from "@saga-admin/client/openai-agents";
import { tool as openaiTool } from "@openai/agents";
import { tool as aiTool, type Tool } from "ai";
import { z } from "zod";

/** An integrator's own argument type: an interface, which has no index signature. */
interface Payment {
  customer: string;
  amount: number;
  currency?: string;
}

interface Receipt {
  chargeId: string;
}

declare const saga: Saga;
declare const payment: Payment;
declare function charge(payment: Payment): Promise<Receipt>;

export async function steps(run: Run): Promise<Receipt> {
  // The args' type flows into `do`; the result's out of it.
  const receipt: Receipt = await run.step({
    tool: "payments.charge",
    target: ["customer", payment.customer],
    args: payment,
    compensate: ["payments.refund", payment],
    do: (args) => charge(args),
  });
  // An explicit type argument, and an options object typed by the integrator.
  await run.step<Payment, Receipt>({ tool: "payments.charge", args: payment, do: charge });
  const options: StepOptions<Payment, Receipt> = { tool: "payments.charge", args: payment, do: charge };
  await run.step(options);
  await run.record({ tool: "payments.charge", args: payment });
  await run.plan([{ tool: "payments.charge", args: payment }]);
  // Records and plain object types still do.
  await run.step({ tool: "notes.add", args: { text: "hello" } as Record<string, unknown>, do: () => null });
  await run.step({ tool: "notes.add", args: {}, do: () => null });

  // @ts-expect-error a number is not a JSON object
  await run.step({ tool: "bad", args: 5, do: () => null });
  // @ts-expect-error nor is a string
  await run.step({ tool: "bad", args: "amount=5", do: () => null });
  // @ts-expect-error nor null
  await run.step({ tool: "bad", args: null, do: () => null });
  // @ts-expect-error nor an array
  await run.step({ tool: "bad", args: [payment], do: () => null });
  // @ts-expect-error nor a function
  await run.step({ tool: "bad", args: () => payment, do: () => null });
  // @ts-expect-error `do` gets the args' own type
  await run.step({ tool: "bad", args: payment, do: (args: { other: string }) => args.other });
  return receipt;
}

export async function tools(): Promise<void> {
  const chargeTool: SagaTool<Payment, Receipt> = saga.tool("payments.charge", charge, {
    target: (args) => ["customer", args.customer],
    compensate: (args) => ["payments.refund", { customer: args.customer, amount: args.amount }],
  });
  const receipt: Receipt = await chargeTool(payment);
  void receipt;
  const annotated = saga.tool("payments.charge", async (args: Payment) => args.amount);
  const amount: number = await annotated({ customer: "c-9", amount: 120 });
  void amount;

  // @ts-expect-error the tool takes a Payment
  await chargeTool({ customer: "c-9" });
  // @ts-expect-error a tool's argument is an object, not a number
  saga.tool("bad", async (amount: number) => amount);
  // @ts-expect-error nor a string
  saga.tool("bad", async (text: string) => text);
  // @ts-expect-error nor an array
  saga.tool("bad", async (items: string[]) => items.length);
}

export function adapters(): void {
  // The AI SDK: a tool typed by an interface, its options functions of that interface.
  const typed: Tool<Payment, Receipt> = aiTool<Payment, Receipt>({
    description: "Charge a customer",
    inputSchema: z.object({ customer: z.string(), amount: z.number(), currency: z.string().optional() }) as never,
    execute: (input) => charge(input),
  });
  const wrapped: Tool<Payment, Receipt> = sagaTool("payments.charge", typed, {
    target: (args) => ["customer", args.customer],
    compensate: (args) => ["payments.refund", args],
  });
  void wrapped;
  // @ts-expect-error a tool whose input is a string is not a Saga step
  sagaTool("bad", aiTool<string, string>({ inputSchema: z.string() as never, execute: async (text) => text }));

  // The OpenAI Agents SDK: the model's arguments arrive as JSON, so its options see a record.
  const agentsTool = sagaFunctionTool(
    openaiTool({
      name: "charge",
      description: "Charge a customer",
      parameters: z.object({ customer: z.string(), amount: z.number() }),
      execute: async ({ customer, amount }) => `charged ${customer} ${amount}`,
    }),
    { name: "payments.charge", target: (args) => ["customer", String(args["customer"])] },
  );
  void agentsTool;
}
