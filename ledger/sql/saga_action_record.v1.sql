-- saga_action_record(p): record an action (and its start, when asked) in one server-side call.
--
-- Python keeps every rule: it resolves the policy, builds the row and the audit events' canonical
-- text (ledger.audit.event_template) and passes the sets of states a rule allows; this function
-- only does, under the same locks as the Python path, what needs the database: the idempotency
-- key's lock and lookup, the run's row lock and state, the chain head, the inserts and updates.
-- Where a check needs Python (an active pause's patterns, a pivot's warning, a changed policy) it
-- changes nothing and answers "checks": the service then takes the Python path, whose last
-- statement is this same function with "checked": true (ledger/services/actions/recording.py).

CREATE OR REPLACE FUNCTION saga_action_record(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    v_tenant bigint := (p->>'tenant_id')::bigint;
    v_run text := p->>'run_id';
    v_owner text := coalesce(p->>'run_owner', '');
    v_key text := p->'action'->>'idempotency_key';
    v_checked boolean := coalesce((p->>'checked')::boolean, false);
    v_timeout text := current_setting('lock_timeout');
    v_found jsonb;
    v_status text;
    v_head text;
    v_count integer;
    v_seq integer;
    v_hash text;
    v_event jsonb;
BEGIN
    -- The key's lock (the wait bounded by lock_timeout_ms: 55P03 for a stuck first request), then
    -- its row: a replay hands back the action as it is, and whether the caller reaches its run.
    PERFORM set_config('lock_timeout', (p->>'lock_timeout_ms') || 'ms', true);
    PERFORM pg_advisory_xact_lock(hashtextextended('action-key:' || v_tenant || ':' || v_key, 0));
    PERFORM set_config('lock_timeout', v_timeout, true);
    SELECT to_jsonb(a) INTO v_found FROM ledger_action a
        WHERE a.tenant_id = v_tenant AND a.idempotency_key = v_key;
    IF v_found IS NOT NULL THEN
        RETURN jsonb_build_object(
            'outcome', 'replay',
            'action', v_found,
            'reachable', EXISTS (
                SELECT 1 FROM ledger_run r
                WHERE r.id = v_run AND r.tenant_id = v_tenant AND (v_owner = '' OR r.owner = v_owner)
            )
        );
    END IF;
    -- The run, locked, in the caller's tenant (and agent's, for an agent's key).
    SELECT r.status, r.audit_head, r.action_count INTO v_status, v_head, v_count FROM ledger_run r
        WHERE r.id = v_run AND r.tenant_id = v_tenant AND (v_owner = '' OR r.owner = v_owner)
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('outcome', 'not_found');
    END IF;
    IF v_status = ANY (ARRAY(SELECT jsonb_array_elements_text(p->'closed'))) THEN
        RETURN jsonb_build_object('outcome', 'closed', 'current', v_status);
    END IF;
    IF NOT v_checked AND (
        (SELECT s.version FROM ledger_policystamp s WHERE s.id = 1) IS DISTINCT FROM (p->>'stamp')::bigint
        OR EXISTS (SELECT 1 FROM ledger_pause pa WHERE pa.tenant_id = v_tenant AND pa.lifted_at IS NULL)
        OR (
            (p->>'pivot_class') IS NOT NULL AND EXISTS (
                SELECT 1 FROM ledger_action x
                WHERE x.run_id = v_run AND x.action_class = p->>'pivot_class'
                    AND NOT (x.status = ANY (ARRAY(SELECT jsonb_array_elements_text(p->'not_a_pivot'))))
            )
        )
    ) THEN
        RETURN jsonb_build_object('outcome', 'checks');
    END IF;
    v_seq := v_count + 1;
    INSERT INTO ledger_action
        SELECT * FROM jsonb_populate_record(
            NULL::ledger_action,
            p->'action' || jsonb_build_object('seq', v_seq, 'run_id', v_run, 'tenant_id', v_tenant)
        );
    v_head := CASE WHEN v_head = '' THEN repeat('0', 64) ELSE v_head END;
    FOR v_event IN SELECT e FROM jsonb_array_elements(p->'events') e LOOP
        v_hash := saga_event_insert(v_event, v_head, '{}'::jsonb);
        v_head := v_hash;
    END LOOP;
    UPDATE ledger_run SET audit_head = v_head, action_count = v_seq WHERE id = v_run;
    RETURN jsonb_build_object('outcome', 'created', 'seq', v_seq, 'audit_head', v_head);
END
$fn$;
