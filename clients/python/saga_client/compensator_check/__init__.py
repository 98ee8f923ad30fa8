"""``saga-compensator-check``: a compensator checked against the webhook protocol before the bad
day. ``cases`` loads the protocol's cases (``clients/spec/compensator-cases.json``, shipped here as
``cases.json``), ``webhook`` runs them against an HTTP compensator, ``mcp`` against an MCP tool,
``report`` prints the verdicts and ``cli`` is the command."""
