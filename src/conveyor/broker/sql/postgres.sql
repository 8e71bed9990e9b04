-- Named queries of the Postgres transport (psycopg placeholders: %(name)s).
--
-- Tables are unqualified: every connection runs with search_path = the broker's schema, so
-- several Conveyor installations can share one database. Every time comes from the database
-- clock (now() = start of the statement's transaction), never from a client, so leases and
-- delays mean the same thing to every process whatever their clocks say.
--
-- A message row is in exactly one state, decided by its columns at a given now():
--   dead       dead_reason IS NOT NULL
--   delayed    available_at > now()
--   in flight  locked_until >= now()                        (a live lease)
--   ready      available_at <= now() AND (locked_until IS NULL OR locked_until < now())
-- A claim only takes ready rows and retry_later clears the lease, so the states never
-- overlap. An expired lease is simply ready again: that is the whole crash recovery.

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
-- The claim only changes columns that no index covers (locked_until, lease, deliveries), and
-- fillfactor leaves room on each page, so claims are HOT updates: no index is touched.
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
-- The claim walks this in order: highest priority first, then oldest.
CREATE INDEX IF NOT EXISTS conveyor_messages_claim
    ON conveyor_messages (queue, priority DESC, id) WHERE dead_reason IS NULL;
-- When a waiting consumer must wake up: the next delayed row, the next lease to expire.
CREATE INDEX IF NOT EXISTS conveyor_messages_due
    ON conveyor_messages (queue, available_at) WHERE dead_reason IS NULL;

-- name: publish
INSERT INTO conveyor_messages (queue, body, priority, available_at)
VALUES (%(queue)s, %(body)s, %(priority)s, now() + make_interval(secs => %(delay)s))
RETURNING pg_notify(%(channel)s, queue);

-- name: claim
-- One statement: lock up to :limit ready rows in delivery order, skipping rows another
-- claim holds, and lease them. The commit of a claim does not wait for its WAL flush
-- (synchronous_commit off, for this transaction only): if Postgres itself crashes before the
-- flush, the claim is forgotten and the row is ready again, exactly as if the lease had
-- expired; the consumer then gets LeaseLost when it settles. Nothing can be lost that way.
WITH ready AS (
    SELECT id FROM conveyor_messages
     WHERE queue = %(queue)s AND dead_reason IS NULL AND available_at <= now()
       AND (locked_until IS NULL OR locked_until < now())
     ORDER BY priority DESC, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), async_commit AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
)
UPDATE conveyor_messages AS m
   SET locked_until = now() + make_interval(secs => %(lease_seconds)s),
       lease = %(lease)s,
       deliveries = m.deliveries + 1
  FROM ready
 WHERE m.id = ready.id AND EXISTS (SELECT FROM async_commit)
RETURNING m.id, m.body, m.deliveries, m.priority;

-- name: seconds_until_due
-- How long a consumer of :queues may sleep before a delayed row becomes ready or a lease
-- expires (NULL: nothing pending). Both halves are range scans of conveyor_messages_due.
SELECT EXTRACT(EPOCH FROM min(due) - now())::float8
  FROM unnest(%(queues)s::text[]) AS q(name),
       LATERAL (SELECT min(available_at) AS due FROM conveyor_messages
                 WHERE queue = q.name AND dead_reason IS NULL AND available_at > now()
                UNION ALL
                SELECT min(locked_until) FROM conveyor_messages
                 WHERE queue = q.name AND dead_reason IS NULL AND available_at <= now()
                   AND locked_until >= now()) AS d;

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
UPDATE conveyor_messages
   SET available_at = now() + make_interval(secs => %(delay)s), locked_until = NULL,
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
-- The first ready messages in delivery order, claiming nothing (the autoscaler's sample).
SELECT body FROM conveyor_messages
 WHERE queue = %(queue)s AND dead_reason IS NULL AND available_at <= now()
   AND (locked_until IS NULL OR locked_until < now())
 ORDER BY priority DESC, id LIMIT %(limit)s;

-- name: depth
-- One pass over the queue's rows. Cheaper than four full conditions per row, and exact
-- because the states never overlap (see the top of this file): a dead row holds no lease, a
-- leased row is never delayed, so ready is what remains.
SELECT total - in_flight - delayed - dead, in_flight, delayed, dead
  FROM (SELECT count(*) AS total,
               count(*) FILTER (WHERE locked_until >= now()) AS in_flight,
               count(*) FILTER (WHERE available_at > now() AND dead_reason IS NULL) AS delayed,
               count(dead_reason) AS dead
          FROM conveyor_messages WHERE queue = %(queue)s) AS counts;

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
