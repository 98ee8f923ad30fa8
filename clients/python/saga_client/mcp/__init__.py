"""``saga-mcp``: a Model Context Protocol gateway that records every tool call in Saga Admin.

Put it between an agent and its MCP server and the agent gets a ledger, approvals and undo
without a code change::

    SAGA_API_KEY=sk_… saga-mcp --saga-url https://saga.example.com --upstream https://hr.internal/mcp

The gateway offers the upstream's tools unchanged (names, schemas, descriptions) and forwards
their list changes. Each MCP session is one run; each ``tools/call`` is a step of it: recorded
(``NS.name`` with the call's arguments and a key derived from the session and the request id),
started, forwarded, and recorded ``succeeded`` or ``failed`` — or ``unknown`` when the upstream
timed out and the call may have happened. A pause or a denying policy rule becomes a tool error
that says why, and the upstream is never called; a call that needs approval waits for a person
(reporting progress when the client asked for it). Saga Admin unreachable → the call is refused:
nothing is forwarded that is not recorded.

One approval, one call: only the request that moved its action to ``running`` forwards it. A
request sent again with the same JSON-RPC id, or any replay of an action already started, is
answered with the first call's outcome (read back from the ledger, waiting while it still runs),
never forwarded a second time.

An upstream that restarts (404 "Session not found") or refuses connections for a while: the call
was not accepted, so the gateway logs a warning, opens a new upstream session and sends it once
more; a call whose connection broke after it was sent is recorded ``unknown``, never resent.

Sessions: over stdio, the process is the session; over Streamable HTTP, an ``initialize``
handshake opens one (``Mcp-Session-Id``) and a ``DELETE``, an idle time-out or the gateway's
shutdown ends it. A client on the stateless 2026 protocol has no session: each call starts a run
unless its ``_meta["saga/run"]`` names one this gateway gave it (every result carries its run
in ``_meta["saga/run"]``). When a session ends, its run fails (into the recovery queue) if a
call failed and was not retried successfully since, and completes otherwise.

The key comes from ``SAGA_API_KEY`` only: a key on a command line is readable by every user of
the machine (``ps``). Whoever reaches ``--listen`` acts with that key, so a listener beyond
loopback needs ``SAGA_MCP_TOKEN``, which every HTTP request must then carry as a bearer token.
Nothing here imports the server: this is the client distribution.

The modules: ``cli`` (the command line and ``main``, the ``saga-mcp`` console script; ``python -m
saga_client.mcp`` runs it too), ``options`` (what a gateway runs with), ``serve`` (reaching the
upstream, serving stdio or Streamable HTTP), ``gateway`` (one call: record, approve, forward,
settle), ``sessions`` (sessions, their runs and how they end), ``results`` (the MCP results it
answers and records), ``listener`` (the HTTP listener's token check and one request per id),
``upstream`` (the upstream session, and opening a new one when the upstream lost it).
"""
