// A webhook compensator in Express: cancels a workspace licence when Saga Admin undoes the agent's
// `workspace.provision_license`. Run: COMPENSATOR_SECRET=... PORT=8103 node compensator.mjs
import { createHmac, timingSafeEqual } from "node:crypto";
import express from "express";

const SECRET = process.env.COMPENSATOR_SECRET;
const licences = new Map([["ada@example.com", { email: "ada@example.com", sku: "pro", status: "active" }]]);
const answers = new Map(); // Idempotency-Key -> the first answer

// X-Saga-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + raw body)>, within 5 minutes.
function signedBySaga(req, raw) {
  const timestamp = req.get("X-Saga-Timestamp") ?? "";
  const signature = Buffer.from(req.get("X-Saga-Signature") ?? "");
  if (!/^\d+$/.test(timestamp) || Math.abs(Date.now() / 1000 - Number(timestamp)) > 300) return false;
  const hmac = createHmac("sha256", SECRET).update(`${timestamp}.`).update(raw).digest("hex");
  const expected = Buffer.from(`sha256=${hmac}`);
  return signature.length === expected.length && timingSafeEqual(signature, expected);
}

const app = express();
app.use(express.raw({ type: () => true })); // the exact bytes: the signature covers them

app.post("/saga/cancel_license", (req, res) => {
  const raw = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
  if (!signedBySaga(req, raw)) return res.status(401).json({ error: "bad signature" });
  let email;
  let step;
  try {
    step = JSON.parse(raw.toString("utf8")); // unknown fields are ignored, never refused
    email = step.args.email;
  } catch {
    return res.status(400).json({ error: "expected a step with args.email" });
  }
  if (typeof email !== "string") return res.status(400).json({ error: "expected a step with args.email" });
  const key = req.get("Idempotency-Key") ?? "";
  if (answers.has(key)) {
    const [status, body] = answers.get(key);
    return res.status(status).json(body);
  }
  const licence = licences.get(email);
  if (!licence || licence.status === "cancelled") return res.status(409).json({ error: "already cancelled", state: licence ?? null });
  const after = step.after_snapshot ?? {};
  if (Object.entries(after).some(([name, value]) => licence[name] !== value)) {
    return res.status(412).json({ error: "changed since the agent's action", state: licence });
  }
  licence.status = "cancelled";
  answers.set(key, [200, { state: { ...licence } }]);
  return res.status(200).json({ state: { ...licence } });
});

// The licence's state, for saga-compensator-check --state-url (signed like the steps).
app.get("/saga/licences/:email", (req, res) => {
  if (!signedBySaga(req, Buffer.alloc(0))) return res.status(401).json({ error: "bad signature" });
  return res.json(licences.get(req.params.email) ?? null);
});

app.listen(Number(process.env.PORT ?? 8103), "127.0.0.1");
