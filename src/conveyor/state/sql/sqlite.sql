-- Named queries of the scheduler's state store on SQLite (the embedded default).
-- Times are Unix seconds passed in by the caller (:now), never read from the database clock.
-- Every task-instance transition is one UPDATE guarded by the state(s) it leaves and the
-- attempt it belongs to: a duplicate or late event changes nothing (rowcount 0).
-- `deadline` is when the scheduler must look at a task instance again (a retry is due, a
-- queued or heartbeat timeout expires, a publish was never confirmed); one index finds them.

-- name: schema_table
CREATE TABLE IF NOT EXISTS conveyor_schema (version INTEGER NOT NULL);

-- name: schema_version
SELECT COALESCE(MAX(version), 0) AS version FROM conveyor_schema;

-- name: set_schema_version
INSERT INTO conveyor_schema (version) VALUES (:version);

-- name: lock_schema
SELECT 1;

-- name: migration_0001
CREATE TABLE conveyor_dags (
    dag_id       TEXT PRIMARY KEY,
    version      TEXT NOT NULL,
    file         TEXT NOT NULL,
    schedule     TEXT,
    timezone     TEXT NOT NULL,
    next_tick    REAL,
    updated_at   REAL NOT NULL
);
CREATE TABLE conveyor_runs (
    run_id       TEXT PRIMARY KEY,
    dag_id       TEXT NOT NULL,
    logical_date REAL NOT NULL,
    state        TEXT NOT NULL,
    run_type     TEXT NOT NULL,
    conf         TEXT NOT NULL,
    dag_version  TEXT NOT NULL,
    created_at   REAL NOT NULL,
    started_at   REAL,
    ended_at     REAL,
    UNIQUE (dag_id, logical_date)
);
CREATE INDEX conveyor_runs_active ON conveyor_runs (state) WHERE state IN ('queued', 'running');
CREATE INDEX conveyor_runs_dag ON conveyor_runs (dag_id, logical_date);
CREATE TABLE conveyor_task_instances (
    ti_id             TEXT PRIMARY KEY,
    run_id            TEXT NOT NULL REFERENCES conveyor_runs (run_id) ON DELETE CASCADE,
    task_id           TEXT NOT NULL,
    position          INTEGER NOT NULL,
    state             TEXT NOT NULL,
    attempt           INTEGER NOT NULL,
    max_attempts      INTEGER NOT NULL,
    executor          TEXT NOT NULL,
    queue             TEXT NOT NULL,
    priority          INTEGER NOT NULL,
    spec              TEXT NOT NULL,
    queued_timeout    REAL NOT NULL,
    heartbeat_timeout REAL NOT NULL,
    queued_at         REAL,
    published_at      REAL,
    started_at        REAL,
    heartbeat_at      REAL,
    ended_at          REAL,
    next_retry_at     REAL,
    deadline          REAL,
    error             TEXT,
    hostname          TEXT,
    pid               INTEGER,
    UNIQUE (run_id, task_id)
);
CREATE INDEX conveyor_ti_deadline ON conveyor_task_instances (deadline)
    WHERE deadline IS NOT NULL;
CREATE TABLE conveyor_edges (
    run_id       TEXT NOT NULL REFERENCES conveyor_runs (run_id) ON DELETE CASCADE,
    upstream     TEXT NOT NULL,
    downstream   TEXT NOT NULL,
    PRIMARY KEY (run_id, downstream, upstream)
);
CREATE INDEX conveyor_edges_upstream ON conveyor_edges (run_id, upstream);
CREATE TABLE conveyor_attempts (
    ti_id        TEXT NOT NULL REFERENCES conveyor_task_instances (ti_id) ON DELETE CASCADE,
    attempt      INTEGER NOT NULL,
    outcome      TEXT NOT NULL,
    queued_at    REAL,
    started_at   REAL,
    ended_at     REAL,
    hostname     TEXT,
    pid          INTEGER,
    error        TEXT,
    PRIMARY KEY (ti_id, attempt)
);

-- name: migration_0002
-- Unfinished task instances of a run, so ending a run costs one index probe, not a scan.
CREATE INDEX conveyor_ti_unfinished ON conveyor_task_instances (run_id)
    WHERE state IN ('pending', 'queued', 'running', 'up_for_retry');

-- name: upsert_dag
INSERT INTO conveyor_dags (dag_id, version, file, schedule, timezone, next_tick, updated_at)
VALUES (:dag_id, :version, :file, :schedule, :timezone, :next_tick, :now)
ON CONFLICT (dag_id) DO UPDATE
   SET version = excluded.version, file = excluded.file, timezone = excluded.timezone,
       updated_at = excluded.updated_at,
       next_tick = CASE WHEN conveyor_dags.schedule IS excluded.schedule
                         AND conveyor_dags.timezone = excluded.timezone
                        THEN conveyor_dags.next_tick ELSE excluded.next_tick END,
       schedule = excluded.schedule;

-- name: dags
SELECT * FROM conveyor_dags ORDER BY dag_id;

-- name: advance_tick
UPDATE conveyor_dags SET next_tick = :next_tick
 WHERE dag_id = :dag_id AND next_tick = :expected;

-- name: insert_run
INSERT INTO conveyor_runs (run_id, dag_id, logical_date, state, run_type, conf, dag_version,
                           created_at)
VALUES (:run_id, :dag_id, :logical_date, 'queued', :run_type, :conf, :dag_version, :now)
ON CONFLICT (dag_id, logical_date) DO NOTHING;

-- name: insert_ti
INSERT INTO conveyor_task_instances (ti_id, run_id, task_id, position, state, attempt,
                                     max_attempts, executor, queue, priority, spec,
                                     queued_timeout, heartbeat_timeout)
VALUES (:ti_id, :run_id, :task_id, :position, 'pending', 0, :max_attempts, :executor, :queue,
        :priority, :spec, :queued_timeout, :heartbeat_timeout);

-- name: insert_edge
INSERT INTO conveyor_edges (run_id, upstream, downstream) VALUES (:run_id, :upstream, :downstream);

-- name: run
SELECT * FROM conveyor_runs WHERE run_id = :run_id;

-- name: run_by_date
SELECT * FROM conveyor_runs WHERE dag_id = :dag_id AND logical_date = :logical_date;

-- name: last_runs
SELECT r.* FROM conveyor_runs r
  JOIN (SELECT dag_id, MAX(logical_date) AS logical_date FROM conveyor_runs GROUP BY dag_id) l
    ON l.dag_id = r.dag_id AND l.logical_date = r.logical_date;

-- name: active_runs
SELECT COUNT(*) AS n FROM conveyor_runs WHERE state IN ('queued', 'running');

-- name: run_tis
SELECT * FROM conveyor_task_instances WHERE run_id = :run_id ORDER BY position;

-- name: run_attempts
SELECT a.* FROM conveyor_attempts a JOIN conveyor_task_instances t ON t.ti_id = a.ti_id
 WHERE t.run_id = :run_id ORDER BY t.position, a.attempt;

-- name: ti
SELECT * FROM conveyor_task_instances WHERE ti_id = :ti_id;

-- name: ti_locking_run
-- A task instance, with its run's row locked for the rest of the transaction.
SELECT t.* FROM conveyor_task_instances t JOIN conveyor_runs r ON r.run_id = t.run_id
 WHERE t.ti_id = :ti_id;

-- name: tis_locking_run
-- The task instances of a batch of events (ids as a JSON list), with their run's row
-- locked for the rest of the transaction: one query for a batch, not one per event.
SELECT t.* FROM conveyor_task_instances t JOIN conveyor_runs r ON r.run_id = t.run_id
 WHERE t.ti_id IN (SELECT value FROM json_each(:ti_ids));

-- name: lock_run
SELECT run_id FROM conveyor_runs WHERE run_id = :run_id;

-- name: start_queued_runs
-- Oldest first; not a paused DAG's, and no more of one DAG running than its
-- max_active_runs (a backfill of a long range starts a few at a time). The state guard
-- makes two schedulers racing start each run once.
UPDATE conveyor_runs SET state = 'running', started_at = :now
 WHERE state = 'queued' AND run_id IN (
    SELECT q.run_id
      FROM (SELECT run_id, dag_id, logical_date,
                   ROW_NUMBER() OVER (PARTITION BY dag_id ORDER BY logical_date) AS nth
              FROM conveyor_runs WHERE state = 'queued') q
      LEFT JOIN conveyor_dags d ON d.dag_id = q.dag_id
     WHERE COALESCE(d.paused, 0) = 0
       AND (d.max_active_runs IS NULL
            OR q.nth + (SELECT COUNT(*) FROM conveyor_runs r
                         WHERE r.dag_id = q.dag_id AND r.state = 'running')
               <= d.max_active_runs)
     ORDER BY q.logical_date LIMIT :limit)
RETURNING run_id;

-- name: dispatch_ready
-- Every task of a run whose parents have all succeeded (its roots, when it starts).
UPDATE conveyor_task_instances AS t
   SET state = 'queued', attempt = attempt + 1, queued_at = :now, published_at = NULL,
       deadline = :now + :publish_grace
 WHERE t.run_id = :run_id AND t.state = 'pending'
   AND NOT EXISTS (SELECT 1 FROM conveyor_edges e
                     JOIN conveyor_task_instances p
                       ON p.run_id = e.run_id AND p.task_id = e.upstream
                    WHERE e.run_id = t.run_id AND e.downstream = t.task_id
                      AND p.state <> 'success')
RETURNING *;

-- name: dispatch_children
-- The children of a task that just succeeded whose parents have all succeeded.
UPDATE conveyor_task_instances AS t
   SET state = 'queued', attempt = attempt + 1, queued_at = :now, published_at = NULL,
       deadline = :now + :publish_grace
 WHERE t.run_id = :run_id AND t.state = 'pending'
   AND t.task_id IN (SELECT downstream FROM conveyor_edges
                      WHERE run_id = :run_id AND upstream = :task_id)
   AND NOT EXISTS (SELECT 1 FROM conveyor_edges e
                     JOIN conveyor_task_instances p
                       ON p.run_id = e.run_id AND p.task_id = e.upstream
                    WHERE e.run_id = t.run_id AND e.downstream = t.task_id
                      AND p.state <> 'success')
RETURNING *;

-- name: claim_due_retries
UPDATE conveyor_task_instances
   SET state = 'queued', attempt = attempt + 1, queued_at = :now, published_at = NULL,
       started_at = NULL, heartbeat_at = NULL, ended_at = NULL, hostname = NULL, pid = NULL,
       deadline = :now + :publish_grace
 WHERE ti_id IN (SELECT ti_id FROM conveyor_task_instances
                  WHERE state = 'up_for_retry' AND deadline <= :now
                  ORDER BY deadline LIMIT :limit)
RETURNING *;

-- name: claim_unpublished
UPDATE conveyor_task_instances SET deadline = :now + :publish_grace
 WHERE ti_id = :ti_id AND attempt = :attempt AND state = 'queued' AND published_at IS NULL
   AND deadline <= :now
RETURNING *;

-- name: mark_published
UPDATE conveyor_task_instances SET published_at = :now, deadline = :now + queued_timeout
 WHERE ti_id = :ti_id AND attempt = :attempt AND state = 'queued' AND published_at IS NULL;

-- name: due
SELECT ti_id, run_id, state, attempt, published_at FROM conveyor_task_instances
 WHERE deadline <= :now AND state IN ('queued', 'running')
 ORDER BY deadline LIMIT :limit;

-- name: still_due
SELECT * FROM conveyor_task_instances
 WHERE ti_id = :ti_id AND attempt = :attempt AND state = :state AND deadline <= :now;

-- name: next_deadline
SELECT MIN(deadline) AS at FROM conveyor_task_instances WHERE deadline IS NOT NULL;

-- name: ti_started
UPDATE conveyor_task_instances
   SET state = 'running', started_at = :at, heartbeat_at = :now, hostname = :hostname,
       pid = :pid, published_at = COALESCE(published_at, :now),
       deadline = :now + heartbeat_timeout
 WHERE ti_id = :ti_id AND attempt = :attempt AND state IN ('queued', 'running');

-- name: ti_started_late
-- A `started` applied after the attempt ended (events applied out of order): it only
-- fills in what the outcome did not know.
UPDATE conveyor_task_instances
   SET started_at = COALESCE(started_at, :at), hostname = COALESCE(hostname, :hostname),
       pid = COALESCE(pid, :pid)
 WHERE ti_id = :ti_id AND attempt = :attempt AND state NOT IN ('queued', 'running');

-- name: attempt_started_late
UPDATE conveyor_attempts
   SET started_at = COALESCE(started_at, :at), hostname = COALESCE(hostname, :hostname),
       pid = COALESCE(pid, :pid)
 WHERE ti_id = :ti_id AND attempt = :attempt;

-- name: ti_heartbeat
UPDATE conveyor_task_instances
   SET state = 'running', heartbeat_at = :now, started_at = COALESCE(started_at, :at),
       published_at = COALESCE(published_at, :now), deadline = :now + heartbeat_timeout
 WHERE ti_id = :ti_id AND attempt = :attempt AND state IN ('queued', 'running');

-- name: ti_parked
-- The worker parked it (its pool or concurrency key is full): like Airflow's task waiting for
-- a pool slot in `scheduled`, it is not timed out for waiting; `unparked` starts the clock.
UPDATE conveyor_task_instances SET deadline = NULL
 WHERE ti_id = :ti_id AND attempt = :attempt AND state = 'queued';

-- name: ti_unparked
UPDATE conveyor_task_instances SET deadline = :now + queued_timeout
 WHERE ti_id = :ti_id AND attempt = :attempt AND state = 'queued';

-- name: ti_requeued
UPDATE conveyor_task_instances
   SET state = 'queued', queued_at = :now, published_at = :now, error = :error,
       deadline = :now + queued_timeout
 WHERE ti_id = :ti_id AND attempt = :attempt AND state IN ('queued', 'running');

-- name: ti_succeeded
UPDATE conveyor_task_instances
   SET state = 'success', ended_at = :at, error = NULL, deadline = NULL, result = :result,
       started_at = COALESCE(started_at, :started),
       hostname = COALESCE(hostname, :hostname), pid = COALESCE(pid, :pid)
 WHERE ti_id = :ti_id AND attempt = :attempt AND state IN ('queued', 'running');

-- name: ti_up_for_retry
UPDATE conveyor_task_instances
   SET state = 'up_for_retry', ended_at = :at, error = :error, next_retry_at = :next_retry_at,
       deadline = :next_retry_at
 WHERE ti_id = :ti_id AND attempt = :attempt AND state IN ('queued', 'running');

-- name: ti_failed
UPDATE conveyor_task_instances
   SET state = 'failed', ended_at = :at, error = :error, deadline = NULL
 WHERE ti_id = :ti_id AND attempt = :attempt AND state IN ('queued', 'running');

-- name: record_attempt
INSERT INTO conveyor_attempts (ti_id, attempt, outcome, queued_at, started_at, ended_at,
                               hostname, pid, error, result, log)
SELECT ti_id, attempt, :outcome, queued_at, started_at, :at, hostname, pid, :error,
       :result, :log
  FROM conveyor_task_instances WHERE ti_id = :ti_id AND attempt = :attempt;

-- name: upstream_failed
WITH RECURSIVE below (task_id) AS (
    SELECT downstream FROM conveyor_edges WHERE run_id = :run_id AND upstream = :task_id
    UNION
    SELECT e.downstream FROM conveyor_edges e JOIN below b ON e.upstream = b.task_id
     WHERE e.run_id = :run_id
)
UPDATE conveyor_task_instances SET state = 'upstream_failed', ended_at = :now
 WHERE run_id = :run_id AND state = 'pending' AND task_id IN (SELECT task_id FROM below);

-- name: finish_run
UPDATE conveyor_runs
   SET ended_at = :now,
       state = CASE WHEN EXISTS (SELECT 1 FROM conveyor_task_instances
                                  WHERE run_id = :run_id AND state <> 'success')
                    THEN 'failed' ELSE 'success' END
 WHERE run_id = :run_id AND state = 'running'
   AND NOT EXISTS (SELECT 1 FROM conveyor_task_instances
                    WHERE run_id = :run_id
                      AND state IN ('pending', 'queued', 'running', 'up_for_retry'))
RETURNING state, dag_id, created_at;

-- name: migration_0003
-- The worker registry: each `conveyor worker` upserts its row every heartbeat interval, so
-- `conveyor status` can show who serves which queues, how busy, and who went quiet.
CREATE TABLE conveyor_workers (
    worker_id    TEXT PRIMARY KEY,
    hostname     TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    queues       TEXT NOT NULL,
    concurrency  INTEGER NOT NULL,
    busy         INTEGER NOT NULL,
    interval     REAL NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);

-- name: upsert_worker
-- `runners`: what each of its runner slots holds, as JSON (see worker/registry.py).
INSERT INTO conveyor_workers (worker_id, hostname, pid, queues, concurrency, busy, interval,
                              started_at, heartbeat_at, runners)
VALUES (:worker_id, :hostname, :pid, :queues, :concurrency, :busy, :interval,
        :started_at, :now, :runners)
ON CONFLICT (worker_id) DO UPDATE
   SET busy = excluded.busy, queues = excluded.queues, concurrency = excluded.concurrency,
       interval = excluded.interval, heartbeat_at = excluded.heartbeat_at,
       runners = excluded.runners;

-- name: delete_worker
DELETE FROM conveyor_workers WHERE worker_id = :worker_id;

-- name: forget_workers
-- Rows of workers silent for longer than :older_than seconds (crashed long ago).
DELETE FROM conveyor_workers WHERE heartbeat_at < :now - :older_than;

-- name: workers
SELECT * FROM conveyor_workers ORDER BY hostname, pid;

-- name: recent_runs
-- The newest runs, optionally of one DAG and/or in one state ('' = any).
SELECT * FROM conveyor_runs
 WHERE (:dag_id = '' OR dag_id = :dag_id) AND (:state = '' OR state = :state)
 ORDER BY created_at DESC, run_id DESC LIMIT :limit;

-- name: run_ti_by_task
SELECT * FROM conveyor_task_instances WHERE run_id = :run_id AND task_id = :task_id;

-- name: ti_attempts
SELECT * FROM conveyor_attempts WHERE ti_id = :ti_id ORDER BY attempt;

-- name: queues_in_use
-- Queues named by task instances of recent runs, for `conveyor status`.
SELECT DISTINCT queue FROM conveyor_task_instances
 WHERE run_id IN (SELECT run_id FROM conveyor_runs ORDER BY created_at DESC LIMIT :limit);

-- name: migration_0004
-- Task results (`handle.result()`): one final record per message, kept until expires_at.
CREATE TABLE conveyor_results (
    message_id   TEXT PRIMARY KEY,
    record       TEXT NOT NULL,
    expires_at   REAL NOT NULL
);
CREATE INDEX conveyor_results_expiry ON conveyor_results (expires_at);

-- name: put_result
-- First write wins: a redelivered message never replaces a value someone may have read.
-- Returns the row when it was stored (the writer then wakes waiters).
INSERT INTO conveyor_results (message_id, record, expires_at)
VALUES (:message_id, :record, :now + :ttl)
ON CONFLICT (message_id) DO UPDATE SET record = excluded.record, expires_at = excluded.expires_at
 WHERE conveyor_results.expires_at <= :now
RETURNING message_id;

-- name: get_result
SELECT record FROM conveyor_results WHERE message_id = :message_id AND expires_at > :now;

-- name: forget_expired_results
DELETE FROM conveyor_results WHERE expires_at <= :now;

-- name: migration_0005
-- What a DAG task returned (JSON), kept with the run: on the task instance for its
-- downstream tasks, and on the attempt that produced it.
ALTER TABLE conveyor_task_instances ADD COLUMN result TEXT;
ALTER TABLE conveyor_attempts ADD COLUMN result TEXT;

-- name: upstream_results
-- What the parents of a task returned, for its arguments and its context.
SELECT p.task_id, p.result FROM conveyor_edges e
  JOIN conveyor_task_instances p ON p.run_id = e.run_id AND p.task_id = e.upstream
 WHERE e.run_id = :run_id AND e.downstream = :task_id AND p.state = 'success';

-- name: migration_0006
-- Operations on DAGs and runs: a paused DAG starts no runs; `tries` keeps a task's attempt
-- budget, so a cleared task instance gets a whole new budget after the attempts it used.
ALTER TABLE conveyor_dags ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conveyor_task_instances ADD COLUMN tries INTEGER;

-- name: set_paused
UPDATE conveyor_dags SET paused = :paused WHERE dag_id = :dag_id;

-- name: dag_row
SELECT * FROM conveyor_dags WHERE dag_id = :dag_id;

-- name: task_and_below
-- A task instance and every task downstream of it in its run, in DAG order.
WITH RECURSIVE below (task_id) AS (
    SELECT :task_id
    UNION
    SELECT e.downstream FROM conveyor_edges e JOIN below b ON e.upstream = b.task_id
     WHERE e.run_id = :run_id
)
SELECT * FROM conveyor_task_instances
 WHERE run_id = :run_id AND task_id IN (SELECT task_id FROM below) ORDER BY position;

-- name: ti_clear
-- Back to pending with a fresh attempt budget (attempt numbers keep counting up).
UPDATE conveyor_task_instances
   SET state = 'pending', tries = COALESCE(tries, max_attempts),
       max_attempts = attempt + COALESCE(tries, max_attempts), queued_at = NULL,
       published_at = NULL, started_at = NULL, ended_at = NULL, heartbeat_at = NULL,
       deadline = NULL, next_retry_at = NULL, hostname = NULL, pid = NULL, error = NULL,
       result = NULL
 WHERE ti_id = :ti_id AND state NOT IN ('queued', 'running');

-- name: ti_mark
-- Set by hand: the attempt in flight, if any, is ignored when its outcome arrives.
UPDATE conveyor_task_instances
   SET state = :state, ended_at = :now, deadline = NULL, next_retry_at = NULL,
       error = :error
 WHERE ti_id = :ti_id;

-- name: reblock_pending
-- Pending tasks below a failed one are upstream_failed (repeat until nothing changes).
UPDATE conveyor_task_instances AS t SET state = 'upstream_failed', ended_at = :now
 WHERE t.run_id = :run_id AND t.state = 'pending'
   AND EXISTS (SELECT 1 FROM conveyor_edges e
                 JOIN conveyor_task_instances p
                   ON p.run_id = e.run_id AND p.task_id = e.upstream
                WHERE e.run_id = t.run_id AND e.downstream = t.task_id
                  AND p.state IN ('failed', 'upstream_failed'));

-- name: reopen_run
-- A run whose tasks were cleared or marked goes back to queued: the next scheduler tick
-- starts it, dispatches what is ready, and ends it if nothing is left to do.
UPDATE conveyor_runs SET state = 'queued', ended_at = NULL WHERE run_id = :run_id;

-- name: unblock_below
-- Tasks held back only by a failure above a task marked success may run again.
WITH RECURSIVE below (task_id) AS (
    SELECT e.downstream FROM conveyor_edges e
     WHERE e.run_id = :run_id AND e.upstream = :task_id
    UNION
    SELECT e.downstream FROM conveyor_edges e JOIN below b ON e.upstream = b.task_id
     WHERE e.run_id = :run_id
)
UPDATE conveyor_task_instances SET state = 'pending', ended_at = NULL
 WHERE run_id = :run_id AND state = 'upstream_failed'
   AND task_id IN (SELECT task_id FROM below);

-- name: dag_active_runs
SELECT COUNT(*) AS n FROM conveyor_runs
 WHERE dag_id = :dag_id AND state IN ('queued', 'running');

-- name: runs_by_state
SELECT state, COUNT(*) AS n FROM conveyor_runs GROUP BY state;

-- name: tis_by_state
SELECT state, COUNT(*) AS n FROM conveyor_task_instances GROUP BY state;

-- name: migration_0007
-- How many runs of a DAG may run at once (NULL: no limit, e.g. a DAG no scheduler loaded).
ALTER TABLE conveyor_dags ADD COLUMN max_active_runs INTEGER;

-- name: set_max_active_runs
UPDATE conveyor_dags SET max_active_runs = :max_active_runs WHERE dag_id = :dag_id;

-- name: find_runs
-- The dashboard's run list: newest first, by DAG and state ('' = any) and logical date.
SELECT * FROM conveyor_runs
 WHERE (:dag_id = '' OR dag_id = :dag_id) AND (:state = '' OR state = :state)
   AND logical_date >= :since AND logical_date < :until
 ORDER BY created_at DESC, run_id DESC LIMIT :limit;

-- name: run_edges
SELECT upstream, downstream FROM conveyor_edges WHERE run_id = :run_id
 ORDER BY upstream, downstream;

-- name: dag_grid
-- The task instances of a DAG's newest runs, for the grid of runs x tasks.
SELECT t.run_id, t.task_id, t.position, t.state, t.attempt, r.logical_date,
       r.state AS run_state
  FROM conveyor_task_instances t JOIN conveyor_runs r ON r.run_id = t.run_id
 WHERE t.run_id IN (SELECT run_id FROM conveyor_runs WHERE dag_id = :dag_id
                     ORDER BY logical_date DESC LIMIT :limit)
 ORDER BY r.logical_date, t.position;

-- name: migration_0008
-- What the dashboard charts and lists. Queue depth sampled by the scheduler (one row per
-- queue per sampling period, `at` the period's start, so two schedulers write it once; kept
-- a few hours). Attempts found by when they ended, for throughput and failure rate. Each
-- worker's runners (memory against cap) on its heartbeat row. Each autoscaler target's
-- last evaluation, and the replica changes it made, with their reasons.
CREATE TABLE conveyor_queue_samples (
    at           REAL NOT NULL,
    queue        TEXT NOT NULL,
    ready        INTEGER NOT NULL,
    in_flight    INTEGER NOT NULL,
    delayed      INTEGER NOT NULL,
    dead         INTEGER NOT NULL,
    PRIMARY KEY (at, queue)
);
CREATE INDEX conveyor_attempts_ended ON conveyor_attempts (ended_at);
ALTER TABLE conveyor_workers ADD COLUMN runners TEXT;
CREATE TABLE conveyor_scalers (
    target           TEXT PRIMARY KEY,
    kind             TEXT NOT NULL,
    queues           TEXT NOT NULL,
    replicas         INTEGER,
    desired          INTEGER,
    min_replicas     INTEGER NOT NULL,
    max_replicas     INTEGER NOT NULL,
    ready            INTEGER,
    in_flight        INTEGER,
    reason           TEXT NOT NULL,
    error            TEXT,
    polling_interval REAL NOT NULL,
    evaluated_at     REAL NOT NULL
);
CREATE TABLE conveyor_scalings (
    at           REAL NOT NULL,
    target       TEXT NOT NULL,
    from_replicas INTEGER NOT NULL,
    to_replicas  INTEGER NOT NULL,
    reason       TEXT NOT NULL,
    PRIMARY KEY (at, target)
);

-- name: insert_queue_sample
INSERT INTO conveyor_queue_samples (at, queue, ready, in_flight, delayed, dead, succeeded,
                                    failed)
VALUES (:at, :queue, :ready, :in_flight, :delayed, :dead, :succeeded,
        :failed)
ON CONFLICT (at, queue) DO NOTHING;

-- name: forget_queue_samples
DELETE FROM conveyor_queue_samples WHERE at < :before;

-- name: queue_samples
SELECT * FROM conveyor_queue_samples WHERE at >= :since ORDER BY queue, at;

-- name: upsert_scaler
INSERT INTO conveyor_scalers (target, kind, queues, replicas, desired, min_replicas,
                              max_replicas, ready, in_flight, reason, error, polling_interval,
                              evaluated_at)
VALUES (:target, :kind, :queues, :replicas, :desired, :min_replicas, :max_replicas, :ready,
        :in_flight, :reason, :error, :polling_interval, :now)
ON CONFLICT (target) DO UPDATE
   SET kind = excluded.kind, queues = excluded.queues, replicas = excluded.replicas,
       desired = excluded.desired, min_replicas = excluded.min_replicas,
       max_replicas = excluded.max_replicas, ready = excluded.ready,
       in_flight = excluded.in_flight, reason = excluded.reason, error = excluded.error,
       polling_interval = excluded.polling_interval, evaluated_at = excluded.evaluated_at;

-- name: insert_scaling
INSERT INTO conveyor_scalings (at, target, from_replicas, to_replicas, reason)
VALUES (:now, :target, :from_replicas, :to_replicas, :reason)
ON CONFLICT (at, target) DO NOTHING;

-- name: forget_scalings
DELETE FROM conveyor_scalings WHERE at < :before;

-- name: scalers
SELECT * FROM conveyor_scalers ORDER BY target;

-- name: recent_scalings
SELECT * FROM conveyor_scalings ORDER BY at DESC, target LIMIT :limit;

-- name: migration_0009
-- An attempt's last lines of output (JSON list), sent by the worker with its outcome: the
-- dashboard shows them with the attempt.
ALTER TABLE conveyor_attempts ADD COLUMN log TEXT;

-- name: migration_0010
-- Tasks finished in each sampling period, per queue: what registered workers reported on
-- their heartbeats since the previous sample (NULL: not known for that period). They count
-- every task a worker runs, DAG tasks and messages published straight to a broker alike, so
-- they replace counting the scheduler's attempts (and the index that served it).
ALTER TABLE conveyor_queue_samples ADD COLUMN succeeded INTEGER;
ALTER TABLE conveyor_queue_samples ADD COLUMN failed INTEGER;
DROP INDEX conveyor_attempts_ended;
