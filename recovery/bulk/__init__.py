"""Bulk decisions by filter (its own app: ``bulk``): an operator's one decision over every item a
queue filter matches, carried out by a worker item by item.

``models``: the operation (``BulkOperation``: who asked, the filter, the action, the reason,
progress, the first errors) and one row per matched item (``BulkItem``: the item as it was when
the bulk started, and its outcome, written in the transaction of the item's decision). The
decisions themselves are ``recovery.actions.bulk_filter``'s.
"""
