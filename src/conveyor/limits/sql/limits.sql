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

-- name: declare
INSERT INTO conveyor_limit_keys (key, declared) VALUES (:key, :declared)
ON CONFLICT (key) DO UPDATE SET declared = excluded.declared
RETURNING max, per_second, burst, tat;

-- name: key_row
SELECT declared, max, per_second, burst FROM conveyor_limit_keys WHERE key = :key;

-- name: keys
SELECT key, declared, max, per_second, burst, denied FROM conveyor_limit_keys ORDER BY key;

-- name: set_tat
UPDATE conveyor_limit_keys SET tat = :tat WHERE key = :key;

-- name: deny
UPDATE conveyor_limit_keys SET denied = denied + 1 WHERE key = :key;

-- name: purge
DELETE FROM conveyor_limit_tokens WHERE key = :key AND expires < :now;

-- name: used
SELECT COALESCE(SUM(weight), 0) FROM conveyor_limit_tokens WHERE key = :key;

-- name: live_used
SELECT COALESCE(SUM(weight), 0) FROM conveyor_limit_tokens WHERE key = :key AND expires >= :now;

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

-- name: parked_state
SELECT key, moving_until FROM conveyor_limit_parked WHERE id = :id;

-- name: park
INSERT INTO conveyor_limit_parked (id, key, seq, queue, body, priority, weight)
VALUES (:id, :key, :seq, :queue, :body, :priority, :weight);

-- name: repark
UPDATE conveyor_limit_parked SET key = :key, seq = :seq, moving_until = NULL WHERE id = :id;

-- name: next_seq_sqlite
SELECT COALESCE(MAX(seq), 0) + 1 FROM conveyor_limit_parked;

-- name: next_seq_postgres
SELECT nextval('conveyor_limit_seq');

-- name: unpark_drop
DELETE FROM conveyor_limit_parked WHERE id = :id AND key = :key AND moving_until IS NULL;

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
