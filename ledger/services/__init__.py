"""Every state change of the record, one module per entity: ``runs``, ``actions`` (the ledger),
``checkpoints``, ``keys`` (tenants and API keys) and ``idempotency`` (pruning the API's replay
store). Dashboard users live in ``ledger.staff``; the state tables and the one compare-and-set in
``ledger.transitions``."""
