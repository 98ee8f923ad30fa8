"""A webhook compensator in Flask: cancels a workspace licence when Saga Admin undoes the agent's
`workspace.provision_license`. Run: COMPENSATOR_SECRET=... PORT=8101 python flask_compensator.py"""

import json
import os
import threading

from flask import Flask, jsonify, request
from saga_client.signing import verify_signature  # pip install saga-admin-client

SECRET = os.environ["COMPENSATOR_SECRET"]
app = Flask(__name__)
licences = {"ada@example.com": {"email": "ada@example.com", "sku": "pro", "status": "active"}}
answers: dict[str, tuple[int, dict]] = {}  # Idempotency-Key -> (status, body): a retry gets the first answer
lock = threading.Lock()


@app.post("/saga/cancel_license")
def cancel_license():
    raw = request.get_data()  # the exact bytes: the signature covers them
    if not verify_signature(SECRET, request.headers, raw):  # also refuses a stale timestamp
        return jsonify(error="bad signature"), 401
    try:
        step = json.loads(raw)  # unknown fields are ignored, never refused
        email = step["args"]["email"]
    except (ValueError, KeyError, TypeError):
        return jsonify(error="expected a step with args.email"), 400
    key = request.headers.get("Idempotency-Key", "")
    with lock:
        if key in answers:
            status, body = answers[key]
            return jsonify(body), status
        licence = licences.get(email)
        if licence is None or licence["status"] == "cancelled":
            return jsonify(error="already cancelled", state=licence), 409  # done, as far as Saga knows
        after = step.get("after_snapshot") or {}
        if any(licence.get(name) != value for name, value in after.items()):
            return jsonify(error="changed since the agent's action", state=licence), 412  # a human decides
        licence["status"] = "cancelled"
        answers[key] = (200, {"state": dict(licence)})
        return jsonify(answers[key][1]), 200


@app.get("/saga/licences/<email>")
def licence_state(email):
    """The licence's state, for saga-compensator-check --state-url (signed like the steps)."""
    if not verify_signature(SECRET, request.headers, request.get_data()):
        return jsonify(error="bad signature"), 401
    return jsonify(licences.get(email)), 200


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(os.environ.get("PORT", "8101")), threaded=True)
