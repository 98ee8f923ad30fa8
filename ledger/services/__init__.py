"""Every state change of the record, one module per entity: ``runs``, ``actions`` (the ledger, a
package: recording, the compensation rule, the state moves), ``checkpoints``, ``pauses`` (kill
switches), ``limits`` (counting a policy's limits), ``keys`` (tenants and API keys) and
``idempotency`` (pruning the API's replay store); ``writes`` carries the ledger's hot writes to
their server-side functions. Dashboard users live in ``ledger.staff``; the state tables and the
one compare-and-set in ``ledger.transitions``."""
