/** The transport's retry rule against a real socket: a connection that breaks while the answer's
 * body is on its way is a transport error like any other, retried when the request may be
 * repeated (a read, a write with an idempotency key) and never otherwise. No live server needed. */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";

import { SagaUnavailable } from "../src/errors.js";
import { Http, type Settings } from "../src/http.js";

const settings: Settings = {
  retries: 2,
  backoffS: 0,
  maxBackoffS: 0,
  timeoutS: 10,
  pollIntervalS: 1,
  maxPollIntervalS: 1,
  approvalTimeoutS: 10,
};

let server: Server | undefined;

afterEach(async () => {
  await new Promise((resolve) => server?.close(resolve) ?? resolve(undefined));
  server = undefined;
});

/** A server whose first `resets` answers break off mid-body (the connection reset); then it answers whole. */
async function resettingServer(resets: number): Promise<{ url: string; requests: string[] }> {
  const requests: string[] = [];
  const body = JSON.stringify({ id: "run_1", status: "running", padding: "x".repeat(4096) });
  server = createServer((request: IncomingMessage, response: ServerResponse) => {
    requests.push(`${request.method} ${request.headers["idempotency-key"] ?? "-"}`);
    request.resume();
    response.writeHead(200, { "Content-Type": "application/json", "Content-Length": String(body.length) });
    if (requests.length <= resets) {
      response.write(body.slice(0, 100), () => request.socket.resetAndDestroy());
      return;
    }
    response.end(body);
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server!.address() as AddressInfo).port}`, requests };
}

describe("a connection reset while the body is read", () => {
  it("is retried for a read, and the whole answer returned", async () => {
    const { url, requests } = await resettingServer(1);
    const reply = await new Http(url, "sk_test", settings).request<{ id: string }>("GET", "/runs/run_1");
    expect([reply.data.id, reply.resent, requests.length]).toEqual(["run_1", true, 2]);
  });

  it("is retried for a write with an idempotency key, sending the same key", async () => {
    const { url, requests } = await resettingServer(2);
    const reply = await new Http(url, "sk_test", settings).request("POST", "/runs", { body: {}, idempotencyKey: "k-1" });
    expect(reply.status).toBe(200);
    expect(requests).toEqual(["POST k-1", "POST k-1", "POST k-1"]);
  });

  it("is not retried for a write without one, and says Saga Admin did not answer", async () => {
    const { url, requests } = await resettingServer(5);
    const sent = new Http(url, "sk_test", settings).request("POST", "/runs/run_1/notes", { body: { text: "once" } });
    await expect(sent).rejects.toBeInstanceOf(SagaUnavailable);
    expect(requests.length).toBe(1);
  });

  it("gives up after the retries, as SagaUnavailable", async () => {
    const { url, requests } = await resettingServer(10);
    await expect(new Http(url, "sk_test", settings).request("GET", "/runs/run_1")).rejects.toBeInstanceOf(SagaUnavailable);
    expect(requests.length).toBe(settings.retries + 1);
  });
});
