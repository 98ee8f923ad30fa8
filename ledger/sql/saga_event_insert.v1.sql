-- saga_event_insert(e, prev, vals): one audit event of a run's chain, linked to ``prev``; returns
-- the event's hash. Called by saga_action_record and saga_action_move, never by the application.
--
-- Python builds the event (ledger.audit.event_template): its columns and its canonical text in
-- ``parts`` around ``slots``, the values only the database knows (the state an action left, its
-- attempt or completion number, the run of the action it moves), which this function takes from
-- ``vals``, each spelled as jsonb spells it. The hash is the Python chain's: sha256 of
-- prev + "." + text (clients/spec/vectors/audit_events.json). Its data is joined the same way
-- from ``data_parts`` and ``data_slots``; ``vals``' run and chain, when set, are the event's.

CREATE OR REPLACE FUNCTION saga_event_insert(e jsonb, prev text, vals jsonb) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    v_text text := '';
    v_data text := '';
    v_hash text;
    i integer;
BEGIN
    FOR i IN 0 .. jsonb_array_length(e->'parts') - 1 LOOP
        v_text := v_text || (e->'parts'->>i)
            || coalesce((vals->(e->'slots'->>i))::text, '');
    END LOOP;
    FOR i IN 0 .. jsonb_array_length(e->'data_parts') - 1 LOOP
        v_data := v_data || (e->'data_parts'->>i)
            || coalesce((vals->(e->'data_slots'->>i))::text, '');
    END LOOP;
    v_hash := encode(sha256(convert_to(prev || '.' || v_text, 'UTF8')), 'hex');
    INSERT INTO ledger_event (
        tenant_id, run_id, chain, kind, subject_type, subject_id, from_state, to_state,
        actor_type, actor_id, actor_label, reason, data, created_at, prev_hash, hash
    ) VALUES (
        (e->>'tenant')::bigint, coalesce(vals->>'run', e->>'run'), coalesce(vals->>'chain', e->>'chain'),
        e->>'kind', e->>'subject_type',
        e->>'subject_id', coalesce(vals->>(e->>'from_slot'), e->>'from_state'), e->>'to_state',
        e->>'actor_type', e->>'actor_id', e->>'actor_label', e->>'reason', v_data::jsonb,
        (e->>'created_at')::timestamptz, prev, v_hash
    );
    RETURN v_hash;
END
$fn$;
