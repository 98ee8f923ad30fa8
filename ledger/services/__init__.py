"""Every state change of the record, one module per entity: ``runs``, ``actions``,
``checkpoints``, ``keys`` (tenants and API keys) and ``idempotency`` (pruning the API's replay
store). Dashboard users live in ``ledger.staff``; the state tables and the one compare-and-set in
``ledger.transitions``."""

# TEMPORARY re-exports while callers move to the entity modules (removed before this lands).
from ledger.services.actions import *  # noqa: F403
from ledger.services.checkpoints import *  # noqa: F403
from ledger.services.keys import *  # noqa: F403
from ledger.services.runs import *  # noqa: F403
from ledger.staff import *  # noqa: F403
