-- Named queries of the Postgres transport (psycopg placeholders: %(name)s).
--
-- Tables are unqualified: every connection runs with search_path = the broker's schema, so
-- several Conveyor installations can share one database. Every time comes from the database
-- clock (now() = start of the statement's transaction), never from a client, so leases and
-- delays mean the same thing to every process whatever their clocks say.
--
-- A message row is in exactly one state, decided by its columns at a given now():
--   dead       dead_reason IS NOT NULL                       (locked_until IS NULL)
--   stored     locked_until IS NULL AND dead_reason IS NULL  ready, in the ready index
--   waiting    locked_until IS NOT NULL                      in the waiting index, due at
--              locked_until: in flight when it holds a lease, delayed when it does not
--              (a delayed row's locked_until is its available_at)
-- Ready means stored, or waiting and due (locked_until <= now(): an expired lease or a delay
-- that has passed). A claim takes the first ready rows of both indexes and leases them;
-- settling a row clears or deletes it, so the states never overlap. An expired lease is
-- simply due: that is the whole crash recovery. The claim also checks a stored row's
-- available_at: code from before migration_2 still running against this table (a rolling
-- upgrade) publishes and retries delayed rows without a locked_until; they wait in the ready
-- index until due (a waiting consumer finds them at its poll fallback), and `depth` counts
-- them delayed.
--
-- Why two indexes whose predicates split the rows: the claim reads the head of each, and a
-- row leaves the ready index the moment it is claimed, so in-flight and delayed rows are
-- never walked. A claim's WHERE holds the ready index's predicate (and a check of each row
-- it fetches) and its ORDER BY is the index's columns, so whatever the statistics say (a
-- freshly filled table has none) no other plan avoids a sort of the whole queue. What still piles up at an index's head are
-- the entries of claimed and deleted rows until VACUUM removes them; a consumer runs one
-- itself every `vacuum_every` claims (see broker/pgvacuum.py), since a busy queue outruns
-- autovacuum, and autovacuum may be off.

-- name: schema_version
SELECT coalesce(max(version), 0) FROM conveyor_migrations;

-- name: migration_lock
-- Two processes starting at once on a fresh schema would race on CREATE ... IF NOT EXISTS
-- (it is not atomic against a concurrent CREATE); this lock, held to COMMIT, serialises them.
SELECT pg_advisory_xact_lock(hashtext('conveyor.migrate'), hashtext(%(schema)s));

-- name: create_schema
-- {schema} is filled in with psycopg.sql.Identifier: an identifier cannot be a parameter.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS conveyor_migrations (
    version     integer     PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: record_migration
INSERT INTO conveyor_migrations (version) VALUES (%(version)s);

-- name: migration_1
-- The first schema (migration_2 replaces its two indexes). fillfactor leaves room on each
-- page, so the new versions of a row (its claim, heartbeats, a retry) stay on its page.
CREATE TABLE IF NOT EXISTS conveyor_messages (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text        NOT NULL,
    body          bytea       NOT NULL,
    priority      integer     NOT NULL DEFAULT 0,
    available_at  timestamptz NOT NULL DEFAULT now(),
    locked_until  timestamptz,
    lease         uuid,
    deliveries    integer     NOT NULL DEFAULT 0,
    dead_reason   text,
    dead_at       timestamptz
) WITH (fillfactor = 80);
CREATE INDEX IF NOT EXISTS conveyor_messages_claim
    ON conveyor_messages (queue, priority DESC, id) WHERE dead_reason IS NULL;
CREATE INDEX IF NOT EXISTS conveyor_messages_due
    ON conveyor_messages (queue, available_at) WHERE dead_reason IS NULL;

-- name: migration_2
-- Claims that cannot slow down under a backlog (see the top of this file). Rows delayed
-- under version 1 (locked_until NULL, available_at ahead) become waiting rows. The per-table
-- autovacuum settings matter where autovacuum runs: vacuum after a few thousand dead rows,
-- not after a fifth of the table, and without sleeping between pages.
DROP INDEX IF EXISTS conveyor_messages_claim;
DROP INDEX IF EXISTS conveyor_messages_due;
UPDATE conveyor_messages SET locked_until = available_at
 WHERE locked_until IS NULL AND dead_reason IS NULL AND available_at > now();
CREATE INDEX IF NOT EXISTS conveyor_messages_ready
    ON conveyor_messages (queue, priority DESC, id)
 WHERE locked_until IS NULL AND dead_reason IS NULL;
CREATE INDEX IF NOT EXISTS conveyor_messages_waiting
    ON conveyor_messages (queue, locked_until) WHERE locked_until IS NOT NULL;
ALTER TABLE conveyor_messages SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0);

-- name: publish
-- A delayed row is waiting from the start: locked_until is when it becomes due.
INSERT INTO conveyor_messages (queue, body, priority, available_at, locked_until)
SELECT %(queue)s, %(body)s, %(priority)s, at, CASE WHEN %(delay)s > 0 THEN at END
  FROM (SELECT now() + make_interval(secs => %(delay)s) AS at) AS due
RETURNING pg_notify(%(channel)s, queue);

-- name: claim
-- One statement: delete what this consumer acked since its last claim (:ids and :leases,
-- empty arrays when none: ack_soon defers an ack to here), then lock up to :limit ready rows
-- in delivery order, skipping rows another claim holds, and lease them. One round trip and
-- one commit for a task's ack and the next claim. The head of the ready index and the due
-- head of the waiting index are each read in index order, :limit rows at most; only those
-- few are sorted; an acked row is never claimed again here (its lease may have just
-- expired). Rows come back as ('claimed', id, body, deliveries, priority) and
-- ('acked', id, NULL...): an acked id missing was no longer ours.
-- The commit does not wait for its WAL flush (synchronous_commit off, for this transaction
-- only) unless :flush (acks carried with ack_commit=sync): if Postgres itself crashes before
-- the flush, the claim is forgotten and the row is ready again, exactly as if the lease had
-- expired; the consumer then gets LeaseLost when it settles; an ack carried is undone and
-- its message delivered again (see ack_async). Nothing can be lost that way.
WITH async_commit AS MATERIALIZED (
    SELECT set_config('synchronous_commit', CASE WHEN %(flush)s
                      THEN current_setting('synchronous_commit') ELSE 'off' END, true)
), acked AS (
    DELETE FROM conveyor_messages AS m
     USING unnest(%(ids)s::bigint[], %(leases)s::uuid[]) AS held(id, lease)
     WHERE m.id = held.id AND m.lease = held.lease
    RETURNING m.id
), stored AS MATERIALIZED (
    SELECT id, priority FROM conveyor_messages
     WHERE queue = %(queue)s AND locked_until IS NULL AND dead_reason IS NULL
       AND available_at <= now()
     ORDER BY priority DESC, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), due AS MATERIALIZED (
    SELECT id, priority FROM conveyor_messages
     WHERE queue = %(queue)s AND locked_until <= now() AND id <> ALL(%(ids)s::bigint[])
     ORDER BY locked_until
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), ready AS (
    SELECT id FROM (SELECT * FROM stored UNION ALL SELECT * FROM due) AS candidates
     ORDER BY priority DESC, id
     LIMIT %(limit)s
), claimed AS (
    UPDATE conveyor_messages AS m
       SET locked_until = now() + make_interval(secs => %(lease_seconds)s),
           lease = %(lease)s,
           deliveries = m.deliveries + 1
      FROM ready
     WHERE m.id = ready.id AND EXISTS (SELECT FROM async_commit)
    RETURNING m.id, m.body, m.deliveries, m.priority
)
SELECT 'claimed', id, body, deliveries, priority FROM claimed
UNION ALL
SELECT 'acked', id, NULL, NULL, NULL FROM acked;

-- name: seconds_until_due
-- How long a consumer of :queues may sleep before a waiting row (delayed, or in flight)
-- becomes due (NULL: nothing waits; <= 0: something is due now). The head of the waiting index.
SELECT EXTRACT(EPOCH FROM min(due) - now())::float8
  FROM unnest(%(queues)s::text[]) AS q(name),
       LATERAL (SELECT min(locked_until) AS due FROM conveyor_messages
                 WHERE queue = q.name AND locked_until IS NOT NULL) AS d;

-- name: ack
-- ?ack_commit=sync: returns once the deletion is flushed to disk.
DELETE FROM conveyor_messages WHERE id = %(id)s AND lease = %(lease)s;

-- name: ack_async
-- The default: committed (the row is gone for everyone) but not waiting for the WAL flush,
-- which happens within 3 x wal_writer_delay (600 ms by default). Only a crash of Postgres or
-- its host inside that window undoes it: the message is then delivered again when its lease
-- expires. A consumer crash after ack() returned loses nothing. See the module docstring.
WITH async_commit AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
)
DELETE FROM conveyor_messages
 WHERE id = %(id)s AND lease = %(lease)s AND EXISTS (SELECT FROM async_commit);

-- name: ack_many
-- `ack` of many deliveries in one statement (a worker acks a batch it parked); the ids gone.
DELETE FROM conveyor_messages AS m
 USING unnest(%(ids)s::bigint[], %(leases)s::uuid[]) AS held(id, lease)
 WHERE m.id = held.id AND m.lease = held.lease
RETURNING m.id;

-- name: ack_many_async
-- `ack_async` of many deliveries in one statement.
WITH async_commit AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
)
DELETE FROM conveyor_messages AS m
 USING unnest(%(ids)s::bigint[], %(leases)s::uuid[]) AS held(id, lease)
 WHERE m.id = held.id AND m.lease = held.lease AND EXISTS (SELECT FROM async_commit)
RETURNING m.id;

-- name: retry_later
-- Delayed (waiting until available_at) or, without a delay, stored ready at once.
UPDATE conveyor_messages
   SET available_at = now() + make_interval(secs => %(delay)s),
       locked_until = CASE WHEN %(delay)s > 0 THEN now() + make_interval(secs => %(delay)s) END,
       lease = NULL, body = coalesce(%(body)s::bytea, body)
 WHERE id = %(id)s AND lease = %(lease)s
RETURNING pg_notify(%(channel)s, queue);

-- name: dead_letter
UPDATE conveyor_messages
   SET dead_reason = %(reason)s, dead_at = now(), locked_until = NULL, lease = NULL
 WHERE id = %(id)s AND lease = %(lease)s;

-- name: extend_lease
UPDATE conveyor_messages SET locked_until = now() + make_interval(secs => %(seconds)s)
 WHERE id = %(id)s AND lease = %(lease)s;

-- name: release
-- close(): give back what this consumer holds, ready at once; deliveries keeps its count.
UPDATE conveyor_messages AS m SET locked_until = NULL, lease = NULL
  FROM unnest(%(ids)s::bigint[], %(leases)s::uuid[]) AS held(id, lease)
 WHERE m.id = held.id AND m.lease = held.lease
RETURNING pg_notify(%(channel)s, m.queue);

-- name: peek
-- The first ready messages in delivery order, claiming nothing (the autoscaler's sample):
-- the claim's two index heads, without the locks.
SELECT body FROM (
    (SELECT body, priority, id FROM conveyor_messages
      WHERE queue = %(queue)s AND locked_until IS NULL AND dead_reason IS NULL
        AND available_at <= now()
      ORDER BY priority DESC, id LIMIT %(limit)s)
    UNION ALL
    (SELECT body, priority, id FROM conveyor_messages
      WHERE queue = %(queue)s AND locked_until <= now()
      ORDER BY locked_until LIMIT %(limit)s)
) AS ready
 ORDER BY priority DESC, id LIMIT %(limit)s;

-- name: depth
-- One pass over the queue's rows. Cheaper than four full conditions per row, and exact
-- because the states never overlap (see the top of this file): a dead row waits for nothing,
-- a row in flight holds a lease, a delayed one (available_at ahead) does not, so ready is
-- what remains.
SELECT total - in_flight - delayed - dead, in_flight, delayed, dead
  FROM (SELECT count(*) AS total,
               count(*) FILTER (WHERE locked_until > now() AND lease IS NOT NULL) AS in_flight,
               count(*) FILTER (WHERE available_at > now() AND lease IS NULL
                                  AND dead_reason IS NULL) AS delayed,
               count(dead_reason) AS dead
          FROM conveyor_messages WHERE queue = %(queue)s) AS counts;

-- name: dead_queues
-- Queues that hold dead letters (an operator's listing: one pass over the table).
SELECT DISTINCT queue FROM conveyor_messages WHERE dead_reason IS NOT NULL ORDER BY queue;

-- name: dead_letters
SELECT id, queue, body, dead_reason, EXTRACT(EPOCH FROM dead_at)::float8, deliveries
  FROM conveyor_messages
 WHERE queue = %(queue)s AND dead_reason IS NOT NULL
 ORDER BY dead_at, id
 LIMIT %(limit)s;

-- name: requeue_dead
-- :ids NULL means every dead letter of the queue.
WITH moved AS (
    UPDATE conveyor_messages
       SET dead_reason = NULL, dead_at = NULL, available_at = now(), locked_until = NULL,
           lease = NULL, deliveries = 0
     WHERE queue = %(queue)s AND dead_reason IS NOT NULL
       AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved), pg_notify(%(channel)s, %(queue)s);

-- name: purge_dead
-- :ids NULL means every dead letter of the queue.
DELETE FROM conveyor_messages
 WHERE queue = %(queue)s AND dead_reason IS NOT NULL
   AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]));

-- name: purge
DELETE FROM conveyor_messages WHERE queue = %(queue)s;
