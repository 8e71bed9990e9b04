-- Named queries of the SQL limiters (SQLite and Postgres). Parameters are :name (turned into
-- %(name)s for psycopg); times are Unix seconds passed in by the caller, never the database's.

-- name: schema_sqlite
CREATE TABLE IF NOT EXISTS conveyor_limit_keys (
    key        TEXT PRIMARY KEY,
    declared   TEXT NOT NULL DEFAULT '{}',
    max        INTEGER,
    per_second REAL,
    burst      INTEGER,
    tat        REAL NOT NULL DEFAULT 0,
    denied     INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS conveyor_limit_tokens (
    key     TEXT NOT NULL,
    holder  TEXT NOT NULL,
    weight  INTEGER NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (key, holder)
);
CREATE TABLE IF NOT EXISTS conveyor_limit_parked (
    id           TEXT PRIMARY KEY,
    key          TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    queue        TEXT NOT NULL,
    body         BLOB NOT NULL,
    priority     INTEGER NOT NULL,
    weight       INTEGER NOT NULL,
    moving_until REAL
);
CREATE INDEX IF NOT EXISTS conveyor_limit_parked_key ON conveyor_limit_parked (key, seq);
CREATE TABLE IF NOT EXISTS conveyor_unique (
    key     TEXT PRIMARY KEY,
    holder  TEXT NOT NULL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS conveyor_unique_expires ON conveyor_unique (expires);
CREATE TABLE IF NOT EXISTS conveyor_cancel (
    id      TEXT PRIMARY KEY,
    at      REAL NOT NULL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS conveyor_cancel_at ON conveyor_cancel (at);
CREATE INDEX IF NOT EXISTS conveyor_cancel_expires ON conveyor_cancel (expires);

-- name: schema_postgres
CREATE TABLE IF NOT EXISTS conveyor_limit_keys (
    key        TEXT PRIMARY KEY,
    declared   TEXT NOT NULL DEFAULT '{}',
    max        INTEGER,
    per_second DOUBLE PRECISION,
    burst      INTEGER,
    tat        DOUBLE PRECISION NOT NULL DEFAULT 0,
    denied     BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS conveyor_limit_tokens (
    key     TEXT NOT NULL,
    holder  TEXT NOT NULL,
    weight  INTEGER NOT NULL,
    expires DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (key, holder)
);
CREATE SEQUENCE IF NOT EXISTS conveyor_limit_seq;
CREATE TABLE IF NOT EXISTS conveyor_limit_parked (
    id           TEXT PRIMARY KEY,
    key          TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    queue        TEXT NOT NULL,
    body         BYTEA NOT NULL,
    priority     INTEGER NOT NULL,
    weight       INTEGER NOT NULL,
    moving_until DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS conveyor_limit_parked_key ON conveyor_limit_parked (key, seq);
CREATE TABLE IF NOT EXISTS conveyor_unique (
    key     TEXT PRIMARY KEY,
    holder  TEXT NOT NULL,
    expires DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS conveyor_unique_expires ON conveyor_unique (expires);
CREATE TABLE IF NOT EXISTS conveyor_cancel (
    id      TEXT PRIMARY KEY,
    at      DOUBLE PRECISION NOT NULL,
    expires DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS conveyor_cancel_at ON conveyor_cancel (at);
CREATE INDEX IF NOT EXISTS conveyor_cancel_expires ON conveyor_cancel (expires);

-- name: hold
-- take a unique key, or take it over from a holder whose time ran out; no row: it is held
INSERT INTO conveyor_unique (key, holder, expires) VALUES (:key, :holder, :expires)
ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires = excluded.expires
WHERE conveyor_unique.expires <= :now
RETURNING holder;

-- name: holder
SELECT holder FROM conveyor_unique WHERE key = :key AND expires > :now;

-- name: unhold
DELETE FROM conveyor_unique WHERE key = :key AND holder = :holder;

-- name: forget_lapsed_unique
-- the sweep's: keys whose holder's time ran out (by its index, not a scan of every key)
DELETE FROM conveyor_unique WHERE expires <= :now;

-- name: forget_lapsed_cancels
DELETE FROM conveyor_cancel WHERE expires <= :now;

-- name: cancel
INSERT INTO conveyor_cancel (id, at, expires) VALUES (:id, :now, :expires)
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: cancels
SELECT id FROM conveyor_cancel WHERE at >= :since AND expires > :now;

-- name: declare
INSERT INTO conveyor_limit_keys (key, declared) VALUES (:key, :declared)
ON CONFLICT (key) DO UPDATE SET declared = excluded.declared
RETURNING max, per_second, burst, tat;

-- name: key_row
SELECT declared, max, per_second, burst FROM conveyor_limit_keys WHERE key = :key;

-- name: keys
SELECT key, declared, max, per_second, burst, denied FROM conveyor_limit_keys ORDER BY key;

-- name: forget_idle
-- a key that nothing holds or waits on, with no override and a rate bucket full again
-- (tat <= now: the same as no row): keys made from templates would otherwise pile up forever
DELETE FROM conveyor_limit_keys
 WHERE key = :key AND max IS NULL AND per_second IS NULL AND burst IS NULL AND tat <= :now
   AND NOT EXISTS (SELECT 1 FROM conveyor_limit_tokens t WHERE t.key = :key)
   AND NOT EXISTS (SELECT 1 FROM conveyor_limit_parked p WHERE p.key = :key);

-- name: set_tat
UPDATE conveyor_limit_keys SET tat = :tat WHERE key = :key;

-- name: deny
UPDATE conveyor_limit_keys SET denied = denied + 1 WHERE key = :key;


-- name: purge
DELETE FROM conveyor_limit_tokens WHERE key = :key AND expires < :now;

-- name: used
SELECT COALESCE(SUM(weight), 0) FROM conveyor_limit_tokens WHERE key = :key;

-- name: room
SELECT COALESCE(SUM(weight), 0), COALESCE(MAX(CASE WHEN holder = :holder THEN 1 ELSE 0 END), 0)
  FROM conveyor_limit_tokens WHERE key = :key AND expires >= :now;

-- name: live_tokens
SELECT holder, weight FROM conveyor_limit_tokens WHERE key = :key AND expires >= :now
 ORDER BY holder;

-- name: holds
SELECT 1 FROM conveyor_limit_tokens WHERE key = :key AND holder = :holder;

-- name: grant
INSERT INTO conveyor_limit_tokens (key, holder, weight, expires)
VALUES (:key, :holder, :weight, :expires)
ON CONFLICT (key, holder) DO UPDATE SET expires = excluded.expires;

-- name: drop
DELETE FROM conveyor_limit_tokens WHERE key = :key AND holder = :holder;

-- name: renew
UPDATE conveyor_limit_tokens SET expires = :expires WHERE key = :key AND holder = :holder;

-- name: drop_all
DELETE FROM conveyor_limit_tokens WHERE holder = :holder;

-- name: park_sqlite
INSERT INTO conveyor_limit_parked (id, key, seq, queue, body, priority, weight)
VALUES (:id, :key, (SELECT COALESCE(MAX(seq), 0) + 1 FROM conveyor_limit_parked), :queue, :body,
        :priority, :weight)
ON CONFLICT (id) DO UPDATE SET key = excluded.key, seq = excluded.seq, moving_until = NULL
 WHERE conveyor_limit_parked.moving_until IS NOT NULL OR conveyor_limit_parked.key <> excluded.key;

-- name: park_postgres
INSERT INTO conveyor_limit_parked (id, key, seq, queue, body, priority, weight)
VALUES (:id, :key, nextval('conveyor_limit_seq'), :queue, :body, :priority, :weight)
ON CONFLICT (id) DO UPDATE SET key = excluded.key, seq = excluded.seq, moving_until = NULL
 WHERE conveyor_limit_parked.moving_until IS NOT NULL OR conveyor_limit_parked.key <> excluded.key;

-- name: unpark_drop
DELETE FROM conveyor_limit_parked WHERE id = :id AND moving_until IS NULL;

-- name: oldest_parked
SELECT id, queue, body, priority, weight FROM conveyor_limit_parked
 WHERE key = :key AND moving_until IS NULL ORDER BY seq LIMIT :limit;

-- name: mark_moving
UPDATE conveyor_limit_parked SET moving_until = :until WHERE id = :id;

-- name: stale_moving
SELECT id, queue, body, priority, key FROM conveyor_limit_parked
 WHERE moving_until IS NOT NULL AND moving_until < :now;

-- name: moved
DELETE FROM conveyor_limit_parked WHERE id = :id AND moving_until IS NOT NULL;

-- name: waiting
SELECT COUNT(*) FROM conveyor_limit_parked WHERE key = :key AND moving_until IS NULL;

-- name: set_limit
INSERT INTO conveyor_limit_keys (key, max, per_second, burst)
VALUES (:key, :max, :per_second, :burst)
ON CONFLICT (key) DO UPDATE SET max = COALESCE(excluded.max, conveyor_limit_keys.max),
    per_second = COALESCE(excluded.per_second, conveyor_limit_keys.per_second),
    burst = COALESCE(excluded.burst, conveyor_limit_keys.burst);

-- name: clear
UPDATE conveyor_limit_keys SET max = NULL, per_second = NULL, burst = NULL
 WHERE key = :key AND (max IS NOT NULL OR per_second IS NOT NULL OR burst IS NOT NULL);

-- name: admit_function_postgres
-- `admit` in one round trip (the hot path: every limited message, and every parked one):
-- the same steps as SqlLimiter._admit, under the same lock.
CREATE OR REPLACE FUNCTION conveyor_limit_admit(
    p_specs jsonb, p_holder text, p_queue text, p_body bytea, p_priority integer,
    p_now double precision, p_lease double precision, p_reserved boolean,
    p_slack double precision, OUT verdict text, OUT full_key text, OUT delay double precision)
LANGUAGE plpgsql AS $$
DECLARE
    s jsonb;
    r record;
    in_use bigint;
    holds integer;
    lim integer;
    full_weight integer;
    start double precision;
    spacing double precision;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('conveyor-limits:' || current_schema()));
    verdict := 'run'; full_key := ''; delay := 0;
    FOR s IN SELECT value FROM jsonb_array_elements(p_specs) LOOP
        INSERT INTO conveyor_limit_keys (key, declared) VALUES (s->>'key', s::text)
        ON CONFLICT (key) DO UPDATE SET declared = excluded.declared;
    END LOOP;
    FOR s IN SELECT value FROM jsonb_array_elements(p_specs) WHERE value->>'k' = 'c' LOOP
        SELECT COALESCE(SUM(weight), 0), COALESCE(MAX(CASE WHEN holder = p_holder THEN 1 ELSE 0 END), 0)
          INTO in_use, holds
          FROM conveyor_limit_tokens WHERE key = s->>'key' AND expires >= p_now;
        SELECT COALESCE(max, (s->>'max')::integer) INTO lim
          FROM conveyor_limit_keys WHERE key = s->>'key';
        IF holds = 0 AND in_use + (s->>'w')::integer > lim THEN
            full_key := s->>'key';
            full_weight := (s->>'w')::integer;
            EXIT;
        END IF;
    END LOOP;
    IF full_key <> '' THEN
        DELETE FROM conveyor_limit_tokens WHERE holder = p_holder;
        INSERT INTO conveyor_limit_parked AS p (id, key, seq, queue, body, priority, weight)
        VALUES (p_holder, full_key, nextval('conveyor_limit_seq'), p_queue, p_body, p_priority,
                full_weight)
        ON CONFLICT (id) DO UPDATE SET key = excluded.key, seq = excluded.seq, moving_until = NULL
         WHERE p.moving_until IS NOT NULL OR p.key <> excluded.key;
        UPDATE conveyor_limit_keys SET denied = denied + 1 WHERE key = full_key;
        verdict := 'parked';
        RETURN;
    END IF;
    IF NOT p_reserved THEN
        FOR r IN SELECT k.key AS name, COALESCE(k.per_second, (x.value->>'ps')::float8) AS ps,
                        COALESCE(k.burst, (x.value->>'b')::integer) AS b, k.tat AS tat
                   FROM jsonb_array_elements(p_specs) x
                   JOIN conveyor_limit_keys k ON k.key = x.value->>'key'
                  WHERE x.value->>'k' = 'r' LOOP
            spacing := 1.0 / r.ps;
            start := GREATEST(p_now, r.tat - (r.b - 1) * spacing);
            UPDATE conveyor_limit_keys SET tat = GREATEST(r.tat, p_now) + spacing
             WHERE key = r.name;
            IF start - p_now > p_slack THEN
                UPDATE conveyor_limit_keys SET denied = denied + 1 WHERE key = r.name;
            END IF;
            delay := GREATEST(delay, start - p_now);
        END LOOP;
        IF delay > p_slack THEN
            verdict := 'delayed';
            RETURN;
        END IF;
    END IF;
    FOR s IN SELECT value FROM jsonb_array_elements(p_specs) WHERE value->>'k' = 'c' LOOP
        INSERT INTO conveyor_limit_tokens (key, holder, weight, expires)
        VALUES (s->>'key', p_holder, (s->>'w')::integer, p_now + p_lease)
        ON CONFLICT (key, holder) DO UPDATE SET expires = excluded.expires;
    END LOOP;
    DELETE FROM conveyor_limit_parked WHERE id = p_holder AND moving_until IS NULL;
    delay := 0;
END
$$;

-- name: release_function_postgres
-- `release` in one round trip: the steps of SqlLimiter.release, under the same lock.
CREATE OR REPLACE FUNCTION conveyor_limit_release(
    p_holder text, p_keys text[], p_now double precision, p_lease double precision)
RETURNS TABLE (r_id text, r_queue text, r_body bytea, r_priority integer)
LANGUAGE plpgsql AS $$
DECLARE
    k text;
    lim integer;
    room bigint;
    p record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('conveyor-limits:' || current_schema()));
    FOREACH k IN ARRAY p_keys LOOP
        DELETE FROM conveyor_limit_tokens t
         WHERE t.key = k AND (t.holder = p_holder OR t.expires < p_now);
        SELECT COALESCE(c.max, (c.declared::jsonb->>'max')::integer, 1) INTO lim
          FROM conveyor_limit_keys c WHERE c.key = k;
        CONTINUE WHEN lim IS NULL;
        SELECT lim - COALESCE(SUM(t.weight), 0) INTO room
          FROM conveyor_limit_tokens t WHERE t.key = k;
        FOR p IN SELECT q.id, q.queue, q.body, q.priority, q.weight
                   FROM conveyor_limit_parked q
                  WHERE q.key = k AND q.moving_until IS NULL
                  ORDER BY q.seq LIMIT GREATEST(room, 0) LOOP
            EXIT WHEN p.weight > room;
            room := room - p.weight;
            INSERT INTO conveyor_limit_tokens AS t (key, holder, weight, expires)
            VALUES (k, p.id, p.weight, p_now + p_lease)
            ON CONFLICT (key, holder) DO UPDATE SET expires = excluded.expires;
            UPDATE conveyor_limit_parked q SET moving_until = p_now + p_lease WHERE q.id = p.id;
            r_id := p.id; r_queue := p.queue; r_body := p.body; r_priority := p.priority;
            RETURN NEXT;
        END LOOP;
        DELETE FROM conveyor_limit_keys c  -- the query forget_idle
         WHERE c.key = k AND c.max IS NULL AND c.per_second IS NULL AND c.burst IS NULL
           AND c.tat <= p_now
           AND NOT EXISTS (SELECT 1 FROM conveyor_limit_tokens t WHERE t.key = k)
           AND NOT EXISTS (SELECT 1 FROM conveyor_limit_parked q WHERE q.key = k);
    END LOOP;
END
$$;

-- name: park_function_postgres
-- `park_many` in one round trip: the steps of SqlLimiter._park_many, under the same lock.
-- One row per message, in order: the key it was parked on, '' where there was room.
CREATE OR REPLACE FUNCTION conveyor_limit_park_many(
    p_specs jsonb[], p_holders text[], p_queues text[], p_bodies bytea[],
    p_priorities integer[], p_now double precision)
RETURNS TABLE (r_key text)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    s jsonb;
    in_use bigint;
    holds integer;
    lim integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('conveyor-limits:' || current_schema()));
    FOR s IN SELECT DISTINCT ON (x.value->>'key') x.value
               FROM unnest(p_specs) AS a(specs), jsonb_array_elements(a.specs) AS x LOOP
        INSERT INTO conveyor_limit_keys (key, declared) VALUES (s->>'key', s::text)
        ON CONFLICT (key) DO UPDATE SET declared = excluded.declared;
    END LOOP;
    FOR i IN 1 .. COALESCE(array_length(p_holders, 1), 0) LOOP
        r_key := '';
        FOR s IN SELECT value FROM jsonb_array_elements(p_specs[i])
                  WHERE value->>'k' = 'c' LOOP
            SELECT COALESCE(SUM(weight), 0),
                   COALESCE(MAX(CASE WHEN holder = p_holders[i] THEN 1 ELSE 0 END), 0)
              INTO in_use, holds
              FROM conveyor_limit_tokens WHERE key = s->>'key' AND expires >= p_now;
            SELECT COALESCE(max, (s->>'max')::integer) INTO lim
              FROM conveyor_limit_keys WHERE key = s->>'key';
            IF holds = 0 AND in_use + (s->>'w')::integer > lim THEN
                r_key := s->>'key';
                DELETE FROM conveyor_limit_tokens WHERE holder = p_holders[i];
                INSERT INTO conveyor_limit_parked AS p (id, key, seq, queue, body, priority,
                                                        weight)
                VALUES (p_holders[i], r_key, nextval('conveyor_limit_seq'), p_queues[i],
                        p_bodies[i], p_priorities[i], (s->>'w')::integer)
                ON CONFLICT (id) DO UPDATE SET key = excluded.key, seq = excluded.seq,
                                               moving_until = NULL
                 WHERE p.moving_until IS NOT NULL OR p.key <> excluded.key;
                UPDATE conveyor_limit_keys SET denied = denied + 1 WHERE key = r_key;
                EXIT;
            END IF;
        END LOOP;
        RETURN NEXT;
    END LOOP;
END
$$;
