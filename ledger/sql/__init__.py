"""The ledger's PostgreSQL functions, every version of each in a file of its own,
``<function>.v<N>.sql``, the newest its current definition:

- ``saga_action_record`` and ``saga_action_move``: the hot writes, one server-side call each
  (``ledger.services.writes``); ``saga_event_insert``: the audit event both of them append;
- ``saga_archived_run_events_delete``: retention's one way to remove an archived run's audit
  events (SECURITY DEFINER; ``manage.py db_grants`` grants it).

``versions``: how migrations load them, and why a loaded version never changes.
"""
