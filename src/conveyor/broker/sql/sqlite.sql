-- Named queries of the SQLite transport. Times are Unix seconds passed in by the caller
-- (:now), never read from the database clock, so tests can reason about them.

-- name: schema
CREATE TABLE IF NOT EXISTS conveyor_messages (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    queue         TEXT    NOT NULL,
    body          BLOB    NOT NULL,
    priority      INTEGER NOT NULL DEFAULT 0,
    available_at  REAL    NOT NULL,
    locked_until  REAL,
    lease         TEXT,
    deliveries    INTEGER NOT NULL DEFAULT 0,
    dead_reason   TEXT,
    dead_at       REAL
);
CREATE INDEX IF NOT EXISTS conveyor_messages_claim
    ON conveyor_messages (queue, priority DESC, id) WHERE dead_reason IS NULL;

-- name: publish
INSERT INTO conveyor_messages (queue, body, priority, available_at)
VALUES (:queue, :body, :priority, :available_at);

-- name: claim
UPDATE conveyor_messages
   SET locked_until = :now + :lease_seconds, lease = :lease, deliveries = deliveries + 1
 WHERE id IN (SELECT id FROM conveyor_messages
               WHERE queue = :queue AND dead_reason IS NULL AND available_at <= :now
                 AND (locked_until IS NULL OR locked_until < :now)
               ORDER BY priority DESC, id
               LIMIT :limit)
RETURNING id, queue, body, deliveries, priority;

-- name: peek
-- The first ready messages in delivery order, claiming nothing (the autoscaler's sample).
SELECT body FROM conveyor_messages
 WHERE queue = :queue AND dead_reason IS NULL AND available_at <= :now
   AND (locked_until IS NULL OR locked_until < :now)
 ORDER BY priority DESC, id LIMIT :limit;

-- name: next_due
SELECT MIN(COALESCE(locked_until, available_at)) FROM conveyor_messages
 WHERE queue = :queue AND dead_reason IS NULL;

-- name: ack
DELETE FROM conveyor_messages WHERE id = :id AND lease = :lease;

-- name: retry_later
UPDATE conveyor_messages
   SET available_at = :now + :delay, locked_until = NULL, lease = NULL,
       body = COALESCE(:body, body)
 WHERE id = :id AND lease = :lease;

-- name: dead_letter
UPDATE conveyor_messages
   SET dead_reason = :reason, dead_at = :now, locked_until = NULL, lease = NULL
 WHERE id = :id AND lease = :lease;

-- name: extend_lease
UPDATE conveyor_messages SET locked_until = :now + :seconds WHERE id = :id AND lease = :lease;

-- name: release
UPDATE conveyor_messages SET locked_until = NULL, lease = NULL WHERE id = :id AND lease = :lease;

-- name: depth
SELECT
  COALESCE(SUM(dead_reason IS NULL AND available_at <= :now
               AND (locked_until IS NULL OR locked_until < :now)), 0) AS ready,
  COALESCE(SUM(dead_reason IS NULL AND locked_until >= :now), 0) AS in_flight,
  COALESCE(SUM(dead_reason IS NULL AND available_at > :now
               AND (locked_until IS NULL OR locked_until < :now)), 0) AS delayed,
  COALESCE(SUM(dead_reason IS NOT NULL), 0) AS dead
FROM conveyor_messages WHERE queue = :queue;

-- name: dead_queues
-- Queues that hold dead letters (an operator's listing: one pass over the table).
SELECT DISTINCT queue FROM conveyor_messages WHERE dead_reason IS NOT NULL ORDER BY queue;

-- name: dead_letters
SELECT id, queue, body, dead_reason, dead_at, deliveries FROM conveyor_messages
 WHERE queue = :queue AND dead_reason IS NOT NULL ORDER BY dead_at, id LIMIT :limit;

-- name: requeue_dead
UPDATE conveyor_messages
   SET dead_reason = NULL, dead_at = NULL, available_at = :now, deliveries = 0
 WHERE queue = :queue AND dead_reason IS NOT NULL AND (:all OR id = :id);

-- name: purge_dead
DELETE FROM conveyor_messages
 WHERE queue = :queue AND dead_reason IS NOT NULL AND (:all OR id = :id);

-- name: purge
DELETE FROM conveyor_messages WHERE queue = :queue;
