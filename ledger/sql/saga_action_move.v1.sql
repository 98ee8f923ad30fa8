-- saga_action_move(p): an action its agent reports on (start: planned/approved/failed to running;
-- succeed; fail), in one server-side call.
--
-- p: the action (scoped to the tenant and, for an agent's key, its agent), the target state, the
-- states it may leave (``allowed``, and ``allowed_unless_approval`` for an action that needs no
-- approval), the run states closed to it, ``pause_check`` (any active pause of the tenant answers
-- "checks": Python decides), ``counter`` ("attempts" or "completion_seq": counted here, under the
-- run's lock), the columns to set, and the event (ledger.audit.event_template). Answers the
-- action as it is now (ledger/services/actions/moves.py).

CREATE OR REPLACE FUNCTION saga_action_move(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    v_tenant bigint := (p->>'tenant_id')::bigint;
    v_owner text := coalesce(p->>'run_owner', '');
    v_run text;
    v_status text;
    v_head text;
    v_completions integer;
    v_row ledger_action;
    v_new ledger_action;
    v_set jsonb := coalesce(p->'set', '{}'::jsonb);
    v_vals jsonb;
    v_hash text;
BEGIN
    SELECT a.run_id INTO v_run FROM ledger_action a JOIN ledger_run r ON r.id = a.run_id
        WHERE a.id = p->>'action_id' AND a.tenant_id = v_tenant AND (v_owner = '' OR r.owner = v_owner);
    IF NOT FOUND THEN
        RETURN jsonb_build_object('outcome', 'not_found');
    END IF;
    -- The run first, as every writer of its chain does; then the action, read under that lock.
    SELECT r.status, r.audit_head, r.completion_count INTO v_status, v_head, v_completions
        FROM ledger_run r WHERE r.id = v_run FOR UPDATE;
    SELECT * INTO v_row FROM ledger_action a WHERE a.id = p->>'action_id' FOR UPDATE;
    IF v_status = ANY (ARRAY(SELECT jsonb_array_elements_text(p->'closed'))) THEN
        RETURN jsonb_build_object('outcome', 'closed', 'current', v_status, 'action', to_jsonb(v_row));
    END IF;
    IF coalesce((p->>'pause_check')::boolean, false)
        AND EXISTS (SELECT 1 FROM ledger_pause pa WHERE pa.tenant_id = v_tenant AND pa.lifted_at IS NULL)
    THEN
        RETURN jsonb_build_object('outcome', 'checks', 'action', to_jsonb(v_row));
    END IF;
    IF NOT (
        v_row.status = ANY (ARRAY(SELECT jsonb_array_elements_text(p->'allowed')))
        OR (NOT v_row.requires_approval
            AND v_row.status = ANY (ARRAY(SELECT jsonb_array_elements_text(p->'allowed_unless_approval'))))
    ) THEN
        RETURN jsonb_build_object('outcome', 'refused', 'current', v_row.status, 'action', to_jsonb(v_row));
    END IF;
    v_vals := jsonb_build_object('from', v_row.status, 'run', v_run, 'chain', 'run:' || v_run);
    IF p->>'counter' = 'attempts' THEN
        v_vals := v_vals || jsonb_build_object('attempt', v_row.attempts + 1);
        v_set := v_set || jsonb_build_object('attempts', v_row.attempts + 1);
    ELSIF p->>'counter' = 'completion_seq' THEN
        v_completions := v_completions + 1;
        v_vals := v_vals || jsonb_build_object('completion_seq', v_completions);
        v_set := v_set || jsonb_build_object('completion_seq', v_completions);
    END IF;
    v_new := jsonb_populate_record(v_row, v_set || jsonb_build_object('status', p->>'to'));
    UPDATE ledger_action SET
        status = v_new.status, updated_at = v_new.updated_at, attempts = v_new.attempts,
        started_at = v_new.started_at, completed_at = v_new.completed_at, error = v_new.error,
        error_layer = v_new.error_layer, retryable = v_new.retryable, result = v_new.result,
        after_snapshot = v_new.after_snapshot, completion_seq = v_new.completion_seq
        WHERE id = v_row.id;
    v_hash := saga_event_insert(
        p->'event', CASE WHEN v_head = '' THEN repeat('0', 64) ELSE v_head END, v_vals
    );
    UPDATE ledger_run SET audit_head = v_hash, completion_count = v_completions WHERE id = v_run;
    RETURN jsonb_build_object('outcome', 'moved', 'from', v_row.status, 'action', to_jsonb(v_new));
END
$fn$;
