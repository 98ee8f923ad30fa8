"""A webhook compensator in FastAPI: cancels a workspace licence when Saga Admin undoes the agent's
`workspace.provision_license`. Run: COMPENSATOR_SECRET=... PORT=8102 python fastapi_compensator.py"""

import asyncio
import json
import os

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from saga_client.signing import verify_signature  # pip install saga-admin-client

SECRET = os.environ["COMPENSATOR_SECRET"]
app = FastAPI()
licences = {"ada@example.com": {"email": "ada@example.com", "sku": "pro", "status": "active"}}
answers: dict[str, tuple[int, dict]] = {}  # Idempotency-Key -> the first answer
lock = asyncio.Lock()


@app.post("/saga/cancel_license")
async def cancel_license(request: Request) -> JSONResponse:
    raw = await request.body()  # the exact bytes: the signature covers them
    if not verify_signature(SECRET, request.headers, raw):  # also refuses a stale timestamp
        return JSONResponse({"error": "bad signature"}, status_code=401)
    try:
        step = json.loads(raw)  # unknown fields are ignored, never refused
        email = step["args"]["email"]
    except (ValueError, KeyError, TypeError):
        return JSONResponse({"error": "expected a step with args.email"}, status_code=400)
    key = request.headers.get("Idempotency-Key", "")
    async with lock:
        if key in answers:
            status, body = answers[key]
            return JSONResponse(body, status_code=status)
        licence = licences.get(email)
        if licence is None or licence["status"] == "cancelled":
            return JSONResponse({"error": "already cancelled", "state": licence}, status_code=409)
        after = step.get("after_snapshot") or {}
        if any(licence.get(name) != value for name, value in after.items()):
            return JSONResponse(
                {"error": "changed since the agent's action", "state": licence}, status_code=412
            )
        licence["status"] = "cancelled"
        answers[key] = (200, {"state": dict(licence)})
        return JSONResponse(answers[key][1])


@app.get("/saga/licences/{email}")
async def licence_state(email: str, request: Request) -> JSONResponse:
    """The licence's state, for saga-compensator-check --state-url (signed like the steps)."""
    if not verify_signature(SECRET, request.headers, await request.body()):
        return JSONResponse({"error": "bad signature"}, status_code=401)
    return JSONResponse(licences.get(email))


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8102")), log_level="warning")
