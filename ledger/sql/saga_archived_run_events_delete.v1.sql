-- saga_archived_run_events_delete(run_id): the one way a run's audit events leave the log, called
-- by retention (recovery.archive.remove) in the transaction that records the archive.
--
-- The log refuses DELETE (its append-only trigger) and the application's least-privileged role
-- has no DELETE on it (manage.py db_grants). This function runs as its owner (the role that
-- migrates: SECURITY DEFINER, its search_path pinned), is executable only by the roles db_grants
-- grants it to, and deletes the events of chain run:<id> only when the archive of exactly that
-- chain is recorded in the same database: a tombstone (ledger_archivedrun) whose head is the
-- chain's newest hash and whose count is its length, a signed head (ledger_signedhead) at that
-- position with that head, and the tenant-chain event run.archived naming the run and that head.
-- It locks the run's row first, so no event can join the chain meanwhile, and lets the
-- append-only trigger pass for its own statement only (pgtrigger.ignore, set and restored).

CREATE OR REPLACE FUNCTION saga_archived_run_events_delete(p_run_id text) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    v_chain text := 'run:' || p_run_id;
    v_tenant bigint;
    v_head text;
    v_events bigint;
    v_count bigint;
    v_newest text;
    v_triggers text[];
    v_previous text;
    v_deleted bigint;
BEGIN
    PERFORM 1 FROM public.ledger_run WHERE id = p_run_id FOR UPDATE;
    SELECT tenant_id, head, events INTO v_tenant, v_head, v_events
        FROM public.ledger_archivedrun WHERE run_id = p_run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is not archived: its audit events stay', p_run_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT count(*) INTO v_count FROM public.ledger_event WHERE chain = v_chain;
    SELECT hash INTO v_newest FROM public.ledger_event WHERE chain = v_chain ORDER BY id DESC LIMIT 1;
    IF v_count <> v_events OR v_newest IS DISTINCT FROM v_head THEN
        RAISE EXCEPTION 'run %: its audit chain (% events) is not the one archived (% events): its events stay',
            p_run_id, v_count, v_events USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT 1 FROM public.ledger_event WHERE run_id = p_run_id AND chain <> v_chain) THEN
        RAISE EXCEPTION 'run %: events of other chains name it: its events stay', p_run_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM public.ledger_signedhead
        WHERE chain = v_chain AND position = v_events AND head = v_head
    ) THEN
        RAISE EXCEPTION 'run %: no signed head vouches for the archived chain: its events stay', p_run_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM public.ledger_event
        WHERE chain = 'tenant:' || v_tenant AND kind = 'run.archived' AND subject_type = 'run'
            AND subject_id = p_run_id AND data ->> 'head' = v_head
    ) THEN
        RAISE EXCEPTION 'run %: its archive is not recorded on its tenant''s chain: its events stay', p_run_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT array_agg(tgname::text) INTO v_triggers FROM pg_catalog.pg_trigger
        WHERE tgrelid = 'public.ledger_event'::regclass AND tgname LIKE 'pgtrigger\_event\_append\_only\_%';
    v_previous := current_setting('pgtrigger.ignore', true);
    PERFORM set_config('pgtrigger.ignore', '{' || array_to_string(v_triggers, ',') || '}', true);
    DELETE FROM public.ledger_event WHERE chain = v_chain;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    PERFORM set_config('pgtrigger.ignore', coalesce(v_previous, ''), true);
    RETURN v_deleted;
END;
$$;
REVOKE ALL ON FUNCTION saga_archived_run_events_delete(text) FROM PUBLIC;
