-- Named queries of the scheduler's state store on PostgreSQL (psycopg 3).
-- The same queries as sqlite.sql; where they differ, Postgres takes row locks: a run row is
-- locked (FOR UPDATE) while an event of that run is applied, and batch claims skip rows
-- another scheduler holds (FOR UPDATE SKIP LOCKED), so several schedulers share the work.
-- Times are Unix seconds passed in by the caller, never read from the database clock.
-- Every task-instance transition is one UPDATE guarded by the state(s) it leaves and the
-- attempt it belongs to: a duplicate or late event changes nothing (rowcount 0).
-- `deadline` is when the scheduler must look at a task instance again (a retry is due, a
-- queued or heartbeat timeout expires, a claimed publish waits on its claimer); one index
-- finds them.

-- name: schema_table
CREATE TABLE IF NOT EXISTS conveyor_schema (version INTEGER NOT NULL);

-- name: schema_version
SELECT COALESCE(MAX(version), 0) AS version FROM conveyor_schema;

-- name: set_schema_version
INSERT INTO conveyor_schema (version) VALUES (%(version)s);

-- name: lock_schema
SELECT pg_advisory_xact_lock(7306541717);

-- name: migration_0001
CREATE TABLE conveyor_dags (
    dag_id       TEXT PRIMARY KEY,
    version      TEXT NOT NULL,
    file         TEXT NOT NULL,
    schedule     TEXT,
    timezone     TEXT NOT NULL,
    next_tick    DOUBLE PRECISION,
    updated_at   DOUBLE PRECISION NOT NULL
);
CREATE TABLE conveyor_runs (
    run_id       TEXT PRIMARY KEY,
    dag_id       TEXT NOT NULL,
    logical_date DOUBLE PRECISION NOT NULL,
    state        TEXT NOT NULL,
    run_type     TEXT NOT NULL,
    conf         TEXT NOT NULL,
    dag_version  TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    started_at   DOUBLE PRECISION,
    ended_at     DOUBLE PRECISION,
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
    queued_timeout    DOUBLE PRECISION NOT NULL,
    heartbeat_timeout DOUBLE PRECISION NOT NULL,
    queued_at         DOUBLE PRECISION,
    published_at      DOUBLE PRECISION,
    started_at        DOUBLE PRECISION,
    heartbeat_at      DOUBLE PRECISION,
    ended_at          DOUBLE PRECISION,
    next_retry_at     DOUBLE PRECISION,
    deadline          DOUBLE PRECISION,
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
    queued_at    DOUBLE PRECISION,
    started_at   DOUBLE PRECISION,
    ended_at     DOUBLE PRECISION,
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
VALUES (%(dag_id)s, %(version)s, %(file)s, %(schedule)s, %(timezone)s, %(next_tick)s, %(now)s)
ON CONFLICT (dag_id) DO UPDATE
   SET version = excluded.version, file = excluded.file, timezone = excluded.timezone,
       updated_at = excluded.updated_at,
       next_tick = CASE WHEN conveyor_dags.schedule IS NOT DISTINCT FROM excluded.schedule
                         AND conveyor_dags.timezone = excluded.timezone
                        THEN conveyor_dags.next_tick ELSE excluded.next_tick END,
       schedule = excluded.schedule;

-- name: dags
SELECT * FROM conveyor_dags ORDER BY dag_id;

-- name: advance_tick
UPDATE conveyor_dags SET next_tick = %(next_tick)s
 WHERE dag_id = %(dag_id)s AND next_tick = %(expected)s;

-- name: insert_run
INSERT INTO conveyor_runs (run_id, dag_id, logical_date, state, run_type, conf, dag_version,
                           created_at)
VALUES (%(run_id)s, %(dag_id)s, %(logical_date)s, 'queued', %(run_type)s, %(conf)s,
        %(dag_version)s, %(now)s)
ON CONFLICT (dag_id, logical_date) DO NOTHING;

-- name: insert_ti
INSERT INTO conveyor_task_instances (ti_id, run_id, task_id, position, state, attempt,
                                     max_attempts, executor, queue, priority, spec,
                                     queued_timeout, heartbeat_timeout, is_branch)
VALUES (%(ti_id)s, %(run_id)s, %(task_id)s, %(position)s, 'pending', 0, %(max_attempts)s,
        %(executor)s, %(queue)s, %(priority)s, %(spec)s, %(queued_timeout)s,
        %(heartbeat_timeout)s, %(is_branch)s);

-- name: insert_edge
INSERT INTO conveyor_edges (run_id, upstream, downstream)
VALUES (%(run_id)s, %(upstream)s, %(downstream)s);

-- name: run
SELECT * FROM conveyor_runs WHERE run_id = %(run_id)s;

-- name: runs_by_ids
SELECT * FROM conveyor_runs WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: tis_of_runs
SELECT * FROM conveyor_task_instances
 WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb))
 ORDER BY run_id, position, COALESCE(map_index, -1);

-- name: run_by_date
SELECT * FROM conveyor_runs WHERE dag_id = %(dag_id)s AND logical_date = %(logical_date)s;

-- name: last_runs
SELECT r.* FROM conveyor_runs r
  JOIN (SELECT dag_id, MAX(logical_date) AS logical_date FROM conveyor_runs GROUP BY dag_id) l
    ON l.dag_id = r.dag_id AND l.logical_date = r.logical_date;

-- name: active_runs
SELECT COUNT(*) AS n FROM conveyor_runs WHERE state IN ('queued', 'running');

-- name: run_tis
SELECT * FROM conveyor_task_instances WHERE run_id = %(run_id)s
 ORDER BY position, COALESCE(map_index, -1);

-- name: run_attempts
SELECT a.* FROM conveyor_attempts a JOIN conveyor_task_instances t ON t.ti_id = a.ti_id
 WHERE t.run_id = %(run_id)s ORDER BY t.position, COALESCE(t.map_index, -1), a.attempt;

-- name: ti
SELECT * FROM conveyor_task_instances WHERE ti_id = %(ti_id)s;

-- name: ti_locking_run
-- A task instance, with its run's row locked for the rest of the transaction.
SELECT t.* FROM conveyor_task_instances t JOIN conveyor_runs r ON r.run_id = t.run_id
 WHERE t.ti_id = %(ti_id)s
   FOR UPDATE OF r;

-- name: tis_locking_run
-- The task instances of a batch of events (ids as a JSON list), with their run's row
-- locked for the rest of the transaction: one query for a batch, not one per event.
SELECT t.* FROM conveyor_task_instances t JOIN conveyor_runs r ON r.run_id = t.run_id
 WHERE t.ti_id IN (SELECT jsonb_array_elements_text(%(ti_ids)s::jsonb))
   FOR UPDATE OF r;

-- name: lock_run
SELECT run_id FROM conveyor_runs WHERE run_id = %(run_id)s FOR UPDATE;

-- name: start_queued_runs
-- Oldest first; not a paused DAG's, and no more of one DAG running than its
-- max_active_runs (a backfill of a long range starts a few at a time). The state guard
-- makes two schedulers racing start each run once.
UPDATE conveyor_runs SET state = 'running', started_at = %(now)s
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
     ORDER BY q.logical_date LIMIT %(limit)s)
RETURNING run_id;

-- name: pending_children
-- The pending children of tasks that just ended (ids as a JSON list), each with its trigger
-- rule and how many of its direct upstreams are in each kind of state: what the rules judge
-- (scheduler/readiness.py), counted here so a join below 1,000 tasks is one row, not 1,000
-- (and its spec, which lists them all, is parsed once). `branches`: upstreams that
-- succeeded and are branches (`is_branch`).
SELECT c.ti_id, c.task_id, (c.spec::jsonb ->> 'trigger_rule') AS trigger_rule,
       n.total, n.success, n.skipped, n.failed, n.upstream_failed, n.branches
  FROM conveyor_task_instances c
  JOIN (SELECT e.downstream AS task_id, COUNT(*) AS total,
                   SUM(CASE WHEN p.state = 'success' THEN 1 ELSE 0 END) AS success,
                   SUM(CASE WHEN p.state = 'skipped' THEN 1 ELSE 0 END) AS skipped,
                   SUM(CASE WHEN p.state IN ('failed', 'cancelled') THEN 1 ELSE 0 END)
                       AS failed,
                   SUM(CASE WHEN p.state = 'upstream_failed' THEN 1 ELSE 0 END)
                       AS upstream_failed,
                   SUM(CASE WHEN p.state = 'success' AND p.is_branch = 1 THEN 1 ELSE 0 END)
                       AS branches
              FROM conveyor_edges e
              JOIN conveyor_task_instances p ON p.run_id = e.run_id AND p.task_id = e.upstream
             WHERE e.run_id = %(run_id)s
               AND e.downstream IN (SELECT downstream FROM conveyor_edges
                                     WHERE run_id = %(run_id)s AND upstream IN
                                           (SELECT jsonb_array_elements_text(%(task_ids)s::jsonb)))
             GROUP BY e.downstream) n ON n.task_id = c.task_id
 WHERE c.run_id = %(run_id)s AND c.state = 'pending'
 ORDER BY c.position;

-- name: pending_of_run
-- Every pending task of a run, as pending_children (a root: total 0).
SELECT c.ti_id, c.task_id, (c.spec::jsonb ->> 'trigger_rule') AS trigger_rule,
       COALESCE(n.total, 0) AS total, n.success, n.skipped, n.failed, n.upstream_failed,
       n.branches
  FROM conveyor_task_instances c
  LEFT JOIN (SELECT e.downstream AS task_id, COUNT(*) AS total,
                   SUM(CASE WHEN p.state = 'success' THEN 1 ELSE 0 END) AS success,
                   SUM(CASE WHEN p.state = 'skipped' THEN 1 ELSE 0 END) AS skipped,
                   SUM(CASE WHEN p.state IN ('failed', 'cancelled') THEN 1 ELSE 0 END)
                       AS failed,
                   SUM(CASE WHEN p.state = 'upstream_failed' THEN 1 ELSE 0 END)
                       AS upstream_failed,
                   SUM(CASE WHEN p.state = 'success' AND p.is_branch = 1 THEN 1 ELSE 0 END)
                       AS branches
              FROM conveyor_edges e
              JOIN conveyor_task_instances p ON p.run_id = e.run_id AND p.task_id = e.upstream
             WHERE e.run_id = %(run_id)s
             GROUP BY e.downstream) n ON n.task_id = c.task_id
 WHERE c.run_id = %(run_id)s AND c.state = 'pending'
 ORDER BY c.position;

-- name: branch_parents
-- For pending tasks below a branch that succeeded (task ids as a JSON list): what each such
-- branch returned and which tasks each of its children leads to (its spec's `branch`).
SELECT e.downstream AS task_id, p.task_id AS branch_id,
       (p.spec::jsonb -> 'branch')::text AS reach, p.result
  FROM conveyor_edges e
  JOIN conveyor_task_instances p ON p.run_id = e.run_id AND p.task_id = e.upstream
 WHERE e.run_id = %(run_id)s AND e.downstream IN (SELECT jsonb_array_elements_text(%(task_ids)s::jsonb))
   AND p.state = 'success' AND p.is_branch = 1;

-- name: queue_pending
-- Tasks the trigger rules made ready (ids as a JSON list), queued for their first attempt
-- and claimed for publishing; one another scheduler moved first is left alone.
UPDATE conveyor_task_instances
   SET state = 'queued', attempt = attempt + 1, queued_at = %(now)s, published_at = NULL,
       claimed_by = %(scheduler)s, deadline = %(now)s + %(lease)s
 WHERE ti_id IN (SELECT jsonb_array_elements_text(%(ti_ids)s::jsonb)) AND state = 'pending'
RETURNING *;

-- name: end_pending
-- Tasks the trigger rules decided never run (skipped or upstream_failed): their task ids.
UPDATE conveyor_task_instances SET state = %(state)s, ended_at = %(now)s
 WHERE ti_id IN (SELECT jsonb_array_elements_text(%(ti_ids)s::jsonb)) AND state = 'pending'
RETURNING task_id;

-- name: claim_due_retries
UPDATE conveyor_task_instances
   SET state = 'queued', attempt = attempt + 1, queued_at = %(now)s, published_at = NULL,
       waiting_for = NULL, started_at = NULL, heartbeat_at = NULL, ended_at = NULL, hostname = NULL, pid = NULL,
       trigger_event = NULL, claimed_by = %(scheduler)s, deadline = %(now)s + %(lease)s
 WHERE ti_id IN (SELECT ti_id FROM conveyor_task_instances
                  WHERE state = 'up_for_retry' AND deadline <= %(now)s
                  ORDER BY deadline LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: claim_unpublished
-- A queued attempt whose publish was never recorded, once its claimer's lease lapsed (that
-- scheduler died between its claim and its publish): ours to publish now. Never while the
-- claimer lives: it publishes what it claimed itself. Its claimer claims it again: one it
-- held (`waiting_for`: no live worker of its pinned code version), to try once more; one
-- whose claim it saw fail though it committed (its store session lost mid-commit: a
-- failover), since a scheduler records every publish it makes before its next tick.
UPDATE conveyor_task_instances SET claimed_by = %(scheduler)s, deadline = %(now)s + %(lease)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'queued' AND published_at IS NULL
   AND deadline <= %(now)s
   AND (NOT EXISTS (SELECT 1 FROM conveyor_schedulers s
                     WHERE s.scheduler_id = conveyor_task_instances.claimed_by
                       AND s.lease_until > %(now)s)
        OR claimed_by = %(scheduler)s)
RETURNING *;

-- name: ti_reissue
-- A running attempt whose message came back, from a worker that lost it (killed, or its
-- lease lapsed), after its deadline to start: the same attempt queued again, to be
-- published with a fresh deadline, as the redelivery itself would have run it.
UPDATE conveyor_task_instances
   SET state = 'queued', queued_at = %(now)s, published_at = NULL, started_at = NULL,
       heartbeat_at = NULL, hostname = NULL, pid = NULL, waiting_for = NULL,
       claimed_by = %(scheduler)s,
       deadline = %(now)s + %(lease)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'running'
RETURNING *;

-- name: ti_send_again
-- A published attempt of a pinned run past its deadline to start, sent to `<queue>@<version>`
-- when no live worker of that version is left: its message can no longer run (a worker acks
-- it unrun), and may be gone with its queue (RabbitMQ's x-expires). The next attempt, queued
-- to be routed again and not charged to the task's retries (`max_attempts` + 1); `queued_at`
-- kept, so pin_timeout counts from the first queueing.
UPDATE conveyor_task_instances
   SET attempt = attempt + 1, tries = COALESCE(tries, max_attempts),
       max_attempts = max_attempts + 1, published_at = NULL, started_at = NULL,
       heartbeat_at = NULL, hostname = NULL, pid = NULL, waiting_for = NULL,
       trigger_event = NULL, claimed_by = %(scheduler)s, deadline = %(now)s + %(lease)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'queued'
   AND published_at IS NOT NULL
RETURNING *;

-- name: wait_for_claimer
-- Its claimer is alive: look again when the claimer's lease would lapse.
UPDATE conveyor_task_instances
   SET deadline = (SELECT s.lease_until FROM conveyor_schedulers s
                    WHERE s.scheduler_id = conveyor_task_instances.claimed_by)
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'queued' AND published_at IS NULL
   AND deadline <= %(now)s
   AND EXISTS (SELECT 1 FROM conveyor_schedulers s
                WHERE s.scheduler_id = conveyor_task_instances.claimed_by
                  AND s.lease_until > %(now)s);

-- name: mark_published
-- Published: its deadline to start runs from now. `waiting_for` now names the code version
-- whose `<queue>@<version>` it was sent to (NULL: its own queue), for the scheduler to send
-- it again should that version's workers all be gone at its deadline (pinning.py).
UPDATE conveyor_task_instances
   SET published_at = %(now)s, deadline = %(now)s + queued_timeout + %(start_grace)s,
       waiting_for = %(sent_to)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'queued' AND published_at IS NULL;

-- name: due
SELECT ti_id, run_id, state, attempt, published_at FROM conveyor_task_instances
 WHERE deadline <= %(now)s AND state IN ('queued', 'running', 'deferred')
 ORDER BY deadline LIMIT %(limit)s;

-- name: still_due
SELECT * FROM conveyor_task_instances
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = %(state)s AND deadline <= %(now)s;

-- name: next_deadline
SELECT MIN(deadline) AS at FROM conveyor_task_instances WHERE deadline IS NOT NULL;

-- name: ti_started
UPDATE conveyor_task_instances
   SET state = 'running', started_at = %(at)s, heartbeat_at = %(now)s, hostname = %(hostname)s,
       pid = %(pid)s, published_at = COALESCE(published_at, %(now)s),
       deadline = %(now)s + heartbeat_timeout
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state IN ('queued', 'running');

-- name: ti_started_late
-- A `started` applied after the attempt ended (events applied out of order): it only
-- fills in what the outcome did not know.
UPDATE conveyor_task_instances
   SET started_at = COALESCE(started_at, %(at)s), hostname = COALESCE(hostname, %(hostname)s),
       pid = COALESCE(pid, %(pid)s)
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state NOT IN ('queued', 'running');

-- name: attempt_started_late
UPDATE conveyor_attempts
   SET started_at = COALESCE(started_at, %(at)s), hostname = COALESCE(hostname, %(hostname)s),
       pid = COALESCE(pid, %(pid)s)
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s;

-- name: attempt_outcome
SELECT outcome FROM conveyor_attempts WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s;

-- name: ti_heartbeat
UPDATE conveyor_task_instances
   SET state = 'running', heartbeat_at = %(now)s, started_at = COALESCE(started_at, %(at)s),
       published_at = COALESCE(published_at, %(now)s), deadline = %(now)s + heartbeat_timeout
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state IN ('queued', 'running');

-- name: ti_parked
-- The worker parked it (its pool or concurrency key is full): like Airflow's task waiting for
-- a pool slot in `scheduled`, it is not timed out for waiting; `unparked` starts the clock.
UPDATE conveyor_task_instances SET deadline = NULL
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'queued';

-- name: ti_unparked
UPDATE conveyor_task_instances SET deadline = %(now)s + queued_timeout + %(start_grace)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'queued';

-- name: ti_requeued
UPDATE conveyor_task_instances
   SET state = 'queued', queued_at = %(now)s, published_at = %(now)s, error = %(error)s,
       deadline = %(now)s + queued_timeout + %(start_grace)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state IN ('queued', 'running');

-- name: ti_succeeded
UPDATE conveyor_task_instances
   SET state = 'success', ended_at = %(at)s, error = NULL, deadline = NULL, result = %(result)s,
       started_at = COALESCE(started_at, %(started)s),
       hostname = COALESCE(hostname, %(hostname)s), pid = COALESCE(pid, %(pid)s)
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state IN ('queued', 'running');

-- name: ti_skipped
-- The attempt skipped itself (raised Skip, or its command exited with a skip code); why is
-- kept in `error`, for people (the state says it is not one).
UPDATE conveyor_task_instances
   SET state = 'skipped', ended_at = %(at)s, error = %(reason)s, deadline = NULL,
       started_at = COALESCE(started_at, %(started)s),
       hostname = COALESCE(hostname, %(hostname)s), pid = COALESCE(pid, %(pid)s)
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state IN ('queued', 'running');

-- name: ti_up_for_retry
UPDATE conveyor_task_instances
   SET state = 'up_for_retry', ended_at = %(at)s, error = %(error)s,
       next_retry_at = %(next_retry_at)s,
       deadline = %(next_retry_at)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state IN ('queued', 'running', 'deferred');

-- name: ti_failed
UPDATE conveyor_task_instances
   SET state = 'failed', ended_at = %(at)s, error = %(error)s, deadline = NULL
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state IN ('queued', 'running', 'deferred');

-- name: ti_cancelled
-- The attempt was cancelled (its worker says so, or `runs cancel` / `tasks cancel` did it):
-- a terminal state, never retried, left only by a clear or a mark. Any state that has not
-- ended may be cancelled (the engine's event: queued or running; the operations, with the
-- run locked: pending and up_for_retry too).
UPDATE conveyor_task_instances
   SET state = 'cancelled', ended_at = %(at)s, error = %(error)s, deadline = NULL,
       next_retry_at = NULL
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s
   AND state IN ('pending', 'queued', 'running', 'up_for_retry', 'deferred');

-- name: cancel_run
-- A run cancelled as a whole: it ends cancelled once nothing in it runs (finish_run).
UPDATE conveyor_runs SET cancelled_at = %(now)s
 WHERE run_id = %(run_id)s AND state IN ('queued', 'running') AND cancelled_at IS NULL;

-- name: record_attempt
INSERT INTO conveyor_attempts (ti_id, attempt, outcome, queued_at, started_at, ended_at,
                               hostname, pid, error, result, log)
SELECT ti_id, attempt, %(outcome)s, queued_at, started_at, %(at)s, hostname, pid, %(error)s,
       %(result)s, %(log)s
  FROM conveyor_task_instances WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s;

-- name: finish_run
-- A run cancelled as a whole (`runs cancel`: cancelled_at) ends cancelled, even before it
-- started; else failed if any task failed (failed, upstream_failed, cancelled), else success:
-- a task `skipped` by a trigger rule or a branch counts as fine, as in Airflow.
UPDATE conveyor_runs
   SET ended_at = %(now)s,
       state = CASE WHEN cancelled_at IS NOT NULL THEN 'cancelled'
                    WHEN EXISTS (SELECT 1 FROM conveyor_task_instances
                                  WHERE run_id = %(run_id)s AND state NOT IN ('success', 'skipped'))
                    THEN 'failed' ELSE 'success' END
 WHERE run_id = %(run_id)s
   AND (state = 'running' OR (state = 'queued' AND cancelled_at IS NOT NULL))
   AND NOT EXISTS (SELECT 1 FROM conveyor_task_instances
                    WHERE run_id = %(run_id)s
                      AND state IN ('pending', 'queued', 'running', 'up_for_retry', 'deferred'))
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
    interval     DOUBLE PRECISION NOT NULL,
    started_at   DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL
);

-- name: upsert_worker
-- `runners`: what each of its runner slots holds, as JSON (see worker/registry.py).
INSERT INTO conveyor_workers (worker_id, hostname, pid, queues, concurrency, busy, interval,
                              started_at, heartbeat_at, runners, code_version)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s, %(busy)s,
        %(interval)s, %(started_at)s, %(now)s, %(runners)s, %(code_version)s)
ON CONFLICT (worker_id) DO UPDATE
   SET busy = excluded.busy, queues = excluded.queues, concurrency = excluded.concurrency,
       interval = excluded.interval, heartbeat_at = excluded.heartbeat_at,
       runners = excluded.runners, code_version = excluded.code_version;

-- name: delete_worker
DELETE FROM conveyor_workers WHERE worker_id = %(worker_id)s;

-- name: forget_workers
-- Rows of workers silent for longer than :older_than seconds (crashed long ago).
DELETE FROM conveyor_workers WHERE heartbeat_at < %(now)s - %(older_than)s;

-- name: workers
SELECT * FROM conveyor_workers ORDER BY hostname, pid;

-- name: recent_runs
-- The newest runs, optionally of one DAG and/or in one state ('' = any).
SELECT * FROM conveyor_runs
 WHERE (%(dag_id)s = '' OR dag_id = %(dag_id)s) AND (%(state)s = '' OR state = %(state)s)
 ORDER BY created_at DESC, run_id DESC LIMIT %(limit)s;

-- name: run_ti_by_task
SELECT * FROM conveyor_task_instances WHERE run_id = %(run_id)s AND task_id = %(task_id)s;

-- name: ti_attempts
SELECT * FROM conveyor_attempts WHERE ti_id = %(ti_id)s ORDER BY attempt;

-- name: queues_in_use
-- Queues named by task instances of recent runs, for `conveyor status`, and the
-- `<queue>@<version>` queues their pinned tasks were sent to or wait for (`waiting_for`): a
-- backlog left in a gone version's queue shows there.
SELECT queue FROM conveyor_task_instances
 WHERE run_id IN (SELECT run_id FROM conveyor_runs ORDER BY created_at DESC LIMIT %(limit)s)
UNION
SELECT queue || '@' || waiting_for FROM conveyor_task_instances
 WHERE waiting_for IS NOT NULL
   AND run_id IN (SELECT run_id FROM conveyor_runs ORDER BY created_at DESC LIMIT %(limit)s);

-- name: migration_0004
-- Task results (`handle.result()`): one final record per message, kept until expires_at.
CREATE TABLE conveyor_results (
    message_id   TEXT PRIMARY KEY,
    record       TEXT NOT NULL,
    expires_at   DOUBLE PRECISION NOT NULL
);
CREATE INDEX conveyor_results_expiry ON conveyor_results (expires_at);

-- name: put_result
-- First write wins: a redelivered message never replaces a value someone may have read.
-- One statement (one round trip, one commit): the insert, and when it stored a row, the
-- NOTIFY that wakes `wait` in every process LISTENing on the channel (sent at commit).
WITH stored AS (
    INSERT INTO conveyor_results (message_id, record, expires_at)
    VALUES (%(message_id)s, %(record)s, %(now)s + %(ttl)s)
    ON CONFLICT (message_id) DO UPDATE
       SET record = excluded.record, expires_at = excluded.expires_at
     WHERE conveyor_results.expires_at <= %(now)s
    RETURNING message_id
)
SELECT s.message_id FROM stored s
 CROSS JOIN LATERAL (SELECT pg_notify(%(channel)s, s.message_id)) AS notified;

-- name: get_result
SELECT record FROM conveyor_results WHERE message_id = %(message_id)s AND expires_at > %(now)s;

-- name: forget_expired_results
DELETE FROM conveyor_results WHERE expires_at <= %(now)s;

-- name: migration_0005
-- What a DAG task returned (JSON), kept with the run: on the task instance for its
-- downstream tasks, and on the attempt that produced it.
ALTER TABLE conveyor_task_instances ADD COLUMN result TEXT;
ALTER TABLE conveyor_attempts ADD COLUMN result TEXT;

-- name: upstream_results
-- What the parents of a task returned, for its arguments and its context (a skipped one:
-- nothing, but a mapped task skipped by an instance keeps its list, None for that one).
SELECT p.task_id, p.result FROM conveyor_edges e
  JOIN conveyor_task_instances p ON p.run_id = e.run_id AND p.task_id = e.upstream
 WHERE e.run_id = %(run_id)s AND e.downstream = %(task_id)s AND p.state IN ('success', 'skipped');

-- name: migration_0006
-- Operations on DAGs and runs: a paused DAG starts no runs; `tries` keeps a task's attempt
-- budget, so a cleared task instance gets a whole new budget after the attempts it used.
ALTER TABLE conveyor_dags ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conveyor_task_instances ADD COLUMN tries INTEGER;

-- name: set_paused
UPDATE conveyor_dags SET paused = %(paused)s WHERE dag_id = %(dag_id)s;

-- name: dag_row
SELECT * FROM conveyor_dags WHERE dag_id = %(dag_id)s;

-- name: task_and_below
-- A task instance and every task downstream of it in its run, in DAG order.
WITH RECURSIVE below (task_id) AS (
    SELECT %(task_id)s::text
    UNION
    SELECT e.downstream FROM conveyor_edges e JOIN below b ON e.upstream = b.task_id
     WHERE e.run_id = %(run_id)s
)
SELECT * FROM conveyor_task_instances
 WHERE run_id = %(run_id)s AND task_id IN (SELECT task_id FROM below) ORDER BY position;

-- name: ti_clear
-- Back to pending with a fresh attempt budget (attempt numbers keep counting up).
UPDATE conveyor_task_instances
   SET state = 'pending', tries = COALESCE(tries, max_attempts),
       max_attempts = attempt + COALESCE(tries, max_attempts), queued_at = NULL,
       published_at = NULL, started_at = NULL, ended_at = NULL, heartbeat_at = NULL,
       deadline = NULL, next_retry_at = NULL, hostname = NULL, pid = NULL, error = NULL,
       result = NULL, waiting_for = NULL, trigger_event = NULL
 WHERE ti_id = %(ti_id)s AND state NOT IN ('queued', 'running');

-- name: ti_mark
-- Set by hand: the attempt in flight, if any, is ignored when its outcome arrives. A task that
-- had ended keeps its end (its TOOK is what it took, not the time until the mark).
UPDATE conveyor_task_instances
   SET state = %(state)s, ended_at = COALESCE(ended_at, %(now)s), deadline = NULL, next_retry_at = NULL,
       error = %(error)s
 WHERE ti_id = %(ti_id)s;

-- name: ti_retry_now
-- A task waiting out its retry delay is due now: the next scheduler tick queues the attempt.
UPDATE conveyor_task_instances SET deadline = %(now)s, next_retry_at = %(now)s
 WHERE ti_id = %(ti_id)s AND state = 'up_for_retry';

-- name: reopen_run
-- A run whose tasks were cleared or marked goes back to queued: the next scheduler tick
-- starts it, dispatches what is ready, and ends it if nothing is left to do.
-- A cancelled run reopened this way is no longer cancelled as a whole.
UPDATE conveyor_runs SET state = 'queued', ended_at = NULL, cancelled_at = NULL
 WHERE run_id = %(run_id)s;

-- name: unblock_below
-- Tasks below a task marked success that did not run (upstream_failed or skipped) are
-- pending again: the trigger rules judge them afresh (readiness.settle_run).
WITH RECURSIVE below (task_id) AS (
    SELECT e.downstream FROM conveyor_edges e
     WHERE e.run_id = %(run_id)s AND e.upstream = %(task_id)s::text
    UNION
    SELECT e.downstream FROM conveyor_edges e JOIN below b ON e.upstream = b.task_id
     WHERE e.run_id = %(run_id)s
)
UPDATE conveyor_task_instances SET state = 'pending', ended_at = NULL
 WHERE run_id = %(run_id)s AND state IN ('upstream_failed', 'skipped')
   AND task_id IN (SELECT task_id FROM below);

-- name: dag_active_runs
SELECT COUNT(*) AS n FROM conveyor_runs
 WHERE dag_id = %(dag_id)s AND state IN ('queued', 'running');

-- name: runs_by_state
SELECT state, COUNT(*) AS n FROM conveyor_runs GROUP BY state;

-- name: tis_by_state
SELECT state, COUNT(*) AS n FROM conveyor_task_instances GROUP BY state;

-- name: migration_0007
-- How many runs of a DAG may run at once (NULL: no limit, e.g. a DAG no scheduler loaded).
ALTER TABLE conveyor_dags ADD COLUMN max_active_runs INTEGER;

-- name: set_max_active_runs
UPDATE conveyor_dags SET max_active_runs = %(max_active_runs)s WHERE dag_id = %(dag_id)s;

-- name: find_runs
-- The run list (dashboard, `runs list`): newest logical date first, as Airflow lists them
-- (runs a backfill created in one millisecond in date order), by DAG, state ('' = any) and
-- logical date.
SELECT * FROM conveyor_runs
 WHERE (%(dag_id)s = '' OR dag_id = %(dag_id)s) AND (%(state)s = '' OR state = %(state)s)
   AND logical_date >= %(since)s AND logical_date < %(until)s
 ORDER BY logical_date DESC, created_at DESC, run_id DESC LIMIT %(limit)s;

-- name: run_edges
SELECT upstream, downstream FROM conveyor_edges WHERE run_id = %(run_id)s
 ORDER BY upstream, downstream;

-- name: dag_grid
-- The task instances of a DAG's newest runs, for the grid of runs x tasks: a mapped task
-- is one cell (with how many instances it has), its instances are on its page.
SELECT t.run_id, t.task_id, t.position, t.state, t.attempt, r.logical_date,
       r.state AS run_state, t.map_count
  FROM conveyor_task_instances t JOIN conveyor_runs r ON r.run_id = t.run_id
 WHERE t.map_task IS NULL AND t.run_id IN (SELECT run_id FROM conveyor_runs WHERE dag_id = %(dag_id)s
                     ORDER BY logical_date DESC LIMIT %(limit)s)
 ORDER BY r.logical_date, t.position;

-- name: migration_0008
-- What the dashboard charts and lists. Queue depth sampled by the scheduler (one row per
-- queue per sampling period, `at` the period's start, so two schedulers write it once; kept
-- a few hours). Attempts found by when they ended, for throughput and failure rate. Each
-- worker's runners (memory against cap) on its heartbeat row. Each autoscaler target's
-- last evaluation, and the replica changes it made, with their reasons.
CREATE TABLE conveyor_queue_samples (
    at           DOUBLE PRECISION NOT NULL,
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
    polling_interval DOUBLE PRECISION NOT NULL,
    evaluated_at     DOUBLE PRECISION NOT NULL
);
CREATE TABLE conveyor_scalings (
    at           DOUBLE PRECISION NOT NULL,
    target       TEXT NOT NULL,
    from_replicas INTEGER NOT NULL,
    to_replicas  INTEGER NOT NULL,
    reason       TEXT NOT NULL,
    PRIMARY KEY (at, target)
);

-- name: insert_queue_sample
INSERT INTO conveyor_queue_samples (at, queue, ready, in_flight, delayed, dead, succeeded,
                                    failed)
VALUES (%(at)s, %(queue)s, %(ready)s, %(in_flight)s, %(delayed)s, %(dead)s, %(succeeded)s,
        %(failed)s)
ON CONFLICT (at, queue) DO NOTHING;

-- name: forget_queue_samples
DELETE FROM conveyor_queue_samples WHERE at < %(before)s;

-- name: queue_samples
SELECT * FROM conveyor_queue_samples WHERE at >= %(since)s ORDER BY queue, at;

-- name: upsert_scaler
INSERT INTO conveyor_scalers (target, kind, queues, replicas, desired, min_replicas,
                              max_replicas, ready, in_flight, reason, error, polling_interval,
                              evaluated_at)
VALUES (%(target)s, %(kind)s, %(queues)s, %(replicas)s, %(desired)s, %(min_replicas)s,
        %(max_replicas)s, %(ready)s, %(in_flight)s, %(reason)s, %(error)s,
        %(polling_interval)s, %(now)s)
ON CONFLICT (target) DO UPDATE
   SET kind = excluded.kind, queues = excluded.queues, replicas = excluded.replicas,
       desired = excluded.desired, min_replicas = excluded.min_replicas,
       max_replicas = excluded.max_replicas, ready = excluded.ready,
       in_flight = excluded.in_flight, reason = excluded.reason, error = excluded.error,
       polling_interval = excluded.polling_interval, evaluated_at = excluded.evaluated_at;

-- name: insert_scaling
INSERT INTO conveyor_scalings (at, target, from_replicas, to_replicas, reason)
VALUES (%(now)s, %(target)s, %(from_replicas)s, %(to_replicas)s, %(reason)s)
ON CONFLICT (at, target) DO NOTHING;

-- name: forget_scalings
DELETE FROM conveyor_scalings WHERE at < %(before)s;

-- name: scalers
SELECT * FROM conveyor_scalers ORDER BY target;

-- name: recent_scalings
SELECT * FROM conveyor_scalings ORDER BY at DESC, target LIMIT %(limit)s;

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

-- name: migration_0011
-- Each live scheduler's lease, renewed a third of a lease apart by a thread of its own, and
-- on each task instance the scheduler that claimed its attempt for publishing: a live
-- scheduler publishes the attempts a dead one claimed as soon as the dead one's lease lapses.
CREATE TABLE conveyor_schedulers (
    scheduler_id TEXT PRIMARY KEY,
    hostname     TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   DOUBLE PRECISION NOT NULL,
    lease_until  DOUBLE PRECISION NOT NULL
);
ALTER TABLE conveyor_task_instances ADD COLUMN claimed_by TEXT;

-- name: renew_scheduler
INSERT INTO conveyor_schedulers (scheduler_id, hostname, pid, started_at, lease_until)
VALUES (%(scheduler)s, %(hostname)s, %(pid)s, %(now)s, %(now)s + %(lease)s)
ON CONFLICT (scheduler_id) DO UPDATE SET lease_until = excluded.lease_until;

-- name: schedulers
SELECT * FROM conveyor_schedulers ORDER BY started_at;

-- name: forget_scheduler
DELETE FROM conveyor_schedulers WHERE scheduler_id = %(scheduler)s;

-- name: forget_lapsed_schedulers
-- Rows of schedulers whose lease lapsed long ago (killed): nothing they claimed waits on them.
DELETE FROM conveyor_schedulers WHERE lease_until < %(now)s - %(older_than)s;

-- name: migration_0012
-- When a run was cancelled as a whole (`conveyor runs cancel`; NULL: it was not): it ends
-- `cancelled`, not failed.
ALTER TABLE conveyor_runs ADD COLUMN cancelled_at DOUBLE PRECISION;

-- name: migration_0013
-- Dynamic task mapping (`expand`): a mapped task's row stays its summary (`map_count`: how
-- many instances it was expanded into, NULL until then) and each instance is a row of its own
-- (`map_task`: the mapped task's id, `map_index`: its element), created with the summary's
-- move from queued to running in one transaction, so a scheduler killed around it leaves
-- exactly one set.
ALTER TABLE conveyor_task_instances ADD COLUMN map_index INTEGER;
ALTER TABLE conveyor_task_instances ADD COLUMN map_task TEXT;
ALTER TABLE conveyor_task_instances ADD COLUMN map_count INTEGER;
CREATE INDEX conveyor_ti_map ON conveyor_task_instances (run_id, map_task, map_index)
    WHERE map_task IS NOT NULL;

-- name: insert_map_instance
-- One instance of a mapped task, queued and claimed for publishing like any ready task; its
-- retry budget is the mapped task's.
INSERT INTO conveyor_task_instances (ti_id, run_id, task_id, position, state, attempt,
                                     max_attempts, executor, queue, priority, spec,
                                     queued_timeout, heartbeat_timeout, queued_at, claimed_by,
                                     deadline, map_index, map_task)
SELECT %(ti_id)s, run_id, %(task_id)s, position, 'queued', 1, COALESCE(tries, max_attempts),
       executor, queue, priority, %(spec)s, queued_timeout, heartbeat_timeout, %(now)s,
       %(scheduler)s, %(now)s + %(lease)s, %(map_index)s, task_id
  FROM conveyor_task_instances WHERE ti_id = %(map_ti_id)s;

-- name: map_expanded
-- The mapped task, once its instances exist: running until they have all ended.
UPDATE conveyor_task_instances
   SET state = 'running', map_count = %(count)s, published_at = %(now)s, started_at = %(now)s,
       deadline = NULL, claimed_by = NULL
 WHERE ti_id = %(ti_id)s AND state = 'queued' AND attempt = %(attempt)s;

-- name: map_refused
-- A mapped task that cannot expand (not a list, too long: failed) or has nothing to map
-- over (skipped), decided when it would have been queued.
UPDATE conveyor_task_instances
   SET state = %(state)s, error = %(error)s, ended_at = %(now)s, deadline = NULL, claimed_by = NULL,
       map_count = 0
 WHERE ti_id = %(ti_id)s AND state = 'queued' AND attempt = %(attempt)s;

-- name: run_has_maps
-- Whether a run has a mapped task (a run is a snapshot: asked once per run and kept).
SELECT 1 AS found FROM conveyor_task_instances
 WHERE run_id = %(run_id)s AND (spec::jsonb -> 'expand') IS NOT NULL LIMIT 1;

-- name: map_instances
SELECT * FROM conveyor_task_instances WHERE run_id = %(run_id)s AND map_task = %(task_id)s
 ORDER BY map_index;

-- name: maps_done
-- The mapped tasks of a run still running whose instances have all ended.
SELECT p.* FROM conveyor_task_instances p
 WHERE p.run_id = %(run_id)s AND p.state = 'running' AND p.map_count IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM conveyor_task_instances c
                    WHERE c.run_id = p.run_id AND c.map_task = p.task_id
                      AND c.state IN ('pending', 'queued', 'running', 'up_for_retry', 'deferred'));

-- name: map_closed
UPDATE conveyor_task_instances
   SET state = %(state)s, result = %(result)s, error = %(error)s, ended_at = %(now)s
 WHERE ti_id = %(ti_id)s AND state = 'running' AND map_count IS NOT NULL;

-- name: map_reopened
-- A mapped task one of whose instances was cleared or marked: running again until they end.
UPDATE conveyor_task_instances SET state = 'running', result = NULL, error = NULL,
       ended_at = NULL
 WHERE run_id = %(run_id)s AND task_id = %(task_id)s AND map_count > 0
   AND state IN ('success', 'failed', 'skipped');

-- name: forget_map_instances
-- A mapped task cleared as a whole: its instances go, to be created again when it is ready.
-- (their attempts go with them: ON DELETE CASCADE).
DELETE FROM conveyor_task_instances WHERE run_id = %(run_id)s AND map_task = %(task_id)s;

-- name: map_unexpanded
UPDATE conveyor_task_instances SET map_count = NULL
 WHERE run_id = %(run_id)s AND task_id = %(task_id)s;

-- name: migration_0014
-- Callbacks and deadlines. A run keeps its DAG's callbacks and deadline (`alerts`, JSON: a
-- snapshot, like its tasks' specs), when it must have ended (`deadline_at`) and when the
-- scheduler found it had not (`deadline_missed_at`). Each callback fired is a row, written in
-- the transaction of the transition that fires it and unique per (task instance, attempt,
-- kind), or (run, kind) with ti_id '': at most once per transition, whatever the number of
-- schedulers. Its publish is claimed as an attempt's is (`claimed_by`, `deadline`: when to
-- look again), so one recorded by a scheduler killed before publishing it is published by
-- the next (at least once).
ALTER TABLE conveyor_runs ADD COLUMN alerts TEXT;
ALTER TABLE conveyor_runs ADD COLUMN deadline_at DOUBLE PRECISION;
ALTER TABLE conveyor_runs ADD COLUMN deadline_missed_at DOUBLE PRECISION;
CREATE INDEX conveyor_runs_deadline_due ON conveyor_runs (deadline_at)
    WHERE deadline_at IS NOT NULL AND deadline_missed_at IS NULL
      AND state IN ('queued', 'running');
CREATE INDEX conveyor_runs_deadline_missed ON conveyor_runs (deadline_missed_at)
    WHERE deadline_missed_at IS NOT NULL;
CREATE TABLE conveyor_callbacks (
    callback_id  TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL REFERENCES conveyor_runs (run_id) ON DELETE CASCADE,
    ti_id        TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    task         TEXT NOT NULL,
    executor     TEXT NOT NULL,
    queue        TEXT NOT NULL,
    context      TEXT NOT NULL,
    state        TEXT NOT NULL,
    claimed_by   TEXT NOT NULL,
    deadline     DOUBLE PRECISION,
    created_at   DOUBLE PRECISION NOT NULL,
    published_at DOUBLE PRECISION,
    ended_at     DOUBLE PRECISION,
    error        TEXT,
    UNIQUE (run_id, ti_id, attempt, kind)
);
CREATE INDEX conveyor_callbacks_pending ON conveyor_callbacks (deadline)
    WHERE state = 'pending';

-- name: set_run_alerts
UPDATE conveyor_runs SET alerts = %(alerts)s, deadline_at = %(deadline_at)s WHERE run_id = %(run_id)s;

-- name: run_alerts
SELECT run_id, dag_id, logical_date, state, alerts, deadline_at, deadline_missed_at
  FROM conveyor_runs WHERE run_id = %(run_id)s;

-- name: record_callback
-- A transition fired a callback (the caller holds the transition's transaction); nothing if
-- this one was recorded already.
INSERT INTO conveyor_callbacks (callback_id, run_id, ti_id, attempt, kind, task, executor,
                                queue, context, state, claimed_by, deadline, created_at)
VALUES (%(callback_id)s, %(run_id)s, %(ti_id)s, %(attempt)s, %(kind)s, %(task)s, %(executor)s, %(queue)s, %(context)s,
        'pending', %(scheduler)s, %(now)s + %(lease)s, %(now)s)
ON CONFLICT (run_id, ti_id, attempt, kind) DO NOTHING;

-- name: claimed_callbacks
-- What this scheduler recorded and has not published yet.
SELECT * FROM conveyor_callbacks WHERE state = 'pending' AND claimed_by = %(scheduler)s
 ORDER BY created_at LIMIT %(limit)s;

-- name: claim_lapsed_callbacks
-- Recorded callbacks whose claimer is gone (killed before publishing them, or none: `runs
-- cancel` records without a scheduler): ours to publish now.
UPDATE conveyor_callbacks SET claimed_by = %(scheduler)s, deadline = %(now)s + %(lease)s
 WHERE callback_id IN (
       SELECT callback_id FROM conveyor_callbacks c
        WHERE c.state = 'pending' AND c.deadline <= %(now)s
          AND NOT EXISTS (SELECT 1 FROM conveyor_schedulers s
                           WHERE s.scheduler_id = c.claimed_by AND s.lease_until > %(now)s)
        ORDER BY c.deadline LIMIT %(limit)s)
   AND state = 'pending' AND deadline <= %(now)s   -- again: another scheduler may have claimed it
RETURNING *;

-- name: wait_for_callback_claimers
-- Their claimer lives (it publishes them itself): look again when its lease would lapse.
UPDATE conveyor_callbacks
   SET deadline = (SELECT s.lease_until FROM conveyor_schedulers s
                    WHERE s.scheduler_id = conveyor_callbacks.claimed_by)
 WHERE state = 'pending' AND deadline <= %(now)s
   AND EXISTS (SELECT 1 FROM conveyor_schedulers s
                WHERE s.scheduler_id = conveyor_callbacks.claimed_by
                  AND s.lease_until > %(now)s);

-- name: callback_published
UPDATE conveyor_callbacks SET state = 'published', published_at = %(now)s, deadline = NULL
 WHERE callback_id = %(callback_id)s AND state = 'pending';

-- name: callback_ended
-- Its outcome (succeeded, failed), once: a duplicate event changes nothing.
UPDATE conveyor_callbacks SET state = %(state)s, ended_at = %(now)s, error = %(error)s, deadline = NULL
 WHERE callback_id = %(callback_id)s AND state IN ('pending', 'published');

-- name: next_callback_deadline
SELECT MIN(deadline) AS at FROM conveyor_callbacks WHERE state = 'pending';

-- name: run_ends_recorded
-- How many callbacks of the run's own ends were recorded: the next one's `attempt` is one more,
-- so a run reopened (`tasks clear`) that ends again fires again.
SELECT COUNT(*) AS n FROM conveyor_callbacks
 WHERE run_id = %(run_id)s AND ti_id = '' AND kind <> 'deadline';

-- name: run_callbacks
SELECT * FROM conveyor_callbacks WHERE run_id = %(run_id)s ORDER BY created_at, kind;

-- name: callback_failures
SELECT kind, COUNT(*) AS n FROM conveyor_callbacks WHERE state = 'failed' GROUP BY kind;

-- name: deadlines_due
SELECT run_id FROM conveyor_runs
 WHERE deadline_at IS NOT NULL AND deadline_missed_at IS NULL
   AND state IN ('queued', 'running') AND deadline_at <= %(now)s
 ORDER BY deadline_at LIMIT %(limit)s;

-- name: miss_deadline
-- The run had not ended by its deadline: marked once (two schedulers race on this guard).
UPDATE conveyor_runs SET deadline_missed_at = %(now)s
 WHERE run_id = %(run_id)s AND deadline_at IS NOT NULL AND deadline_missed_at IS NULL
   AND state IN ('queued', 'running') AND deadline_at <= %(now)s
RETURNING run_id, dag_id, logical_date, state, alerts, deadline_at, deadline_missed_at;

-- name: next_run_deadline
SELECT MIN(deadline_at) AS at FROM conveyor_runs
 WHERE deadline_at IS NOT NULL AND deadline_missed_at IS NULL
   AND state IN ('queued', 'running');

-- name: deadlines_missed
SELECT COUNT(*) AS n FROM conveyor_runs WHERE deadline_missed_at IS NOT NULL;

-- name: migration_0015
-- Whether a task instance is a branch (`dag.branch`: 1), in a column of its own: readiness
-- counts the branches among a pending task's upstreams from it, where it once looked for
-- `"branch": {` in the spec's JSON text (which a change of json.dumps's separators would have
-- silently missed). Runs created before it get it from their specs.
ALTER TABLE conveyor_task_instances ADD COLUMN is_branch INTEGER NOT NULL DEFAULT 0;
UPDATE conveyor_task_instances SET is_branch = 1
 WHERE (spec::jsonb -> 'branch') IS NOT NULL;

-- name: migration_0016
-- Runs pinned to their code. Each worker announces its code version (`code_version`); a run
-- records the version its first task started on; a pinned run's task that no live worker of
-- that version serves is held unpublished, `waiting_for` naming the version, and looked at
-- again at its `deadline`. Each DAG file's source is kept once per version (its hash), so a
-- run shows the source it was created from after the file changed.
ALTER TABLE conveyor_workers ADD COLUMN code_version TEXT;
ALTER TABLE conveyor_runs ADD COLUMN code_version TEXT;
ALTER TABLE conveyor_task_instances ADD COLUMN waiting_for TEXT;
CREATE TABLE conveyor_dag_sources (
    version      TEXT PRIMARY KEY,
    file         TEXT NOT NULL,
    source       TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL
);

-- name: set_run_code_version
-- The code version of the worker the run's first task started on (later ones keep it).
UPDATE conveyor_runs SET code_version = %(code_version)s
 WHERE run_id = %(run_id)s AND code_version IS NULL;

-- name: repin_run
-- A cleared run moved to another code version (`tasks clear --latest-code`); NULL: the next
-- task without upstreams to start records one.
UPDATE conveyor_runs SET code_version = %(code_version)s WHERE run_id = %(run_id)s;

-- name: run_code_versions
SELECT run_id, code_version FROM conveyor_runs WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: ti_hold
-- A pinned task no live worker of its run's code version serves: kept unpublished, said
-- so, and looked at again at :at.
UPDATE conveyor_task_instances SET waiting_for = %(version)s, deadline = %(at)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'queued'
   AND published_at IS NULL;

-- name: put_dag_source
INSERT INTO conveyor_dag_sources (version, file, source, created_at)
VALUES (%(version)s, %(file)s, %(source)s, %(now)s)
ON CONFLICT (version) DO NOTHING;

-- name: dag_source
SELECT * FROM conveyor_dag_sources WHERE version = %(version)s;

-- name: migration_0017
-- Assets and events (scheduler/assets.py). Every event recorded (a task's outlet on its
-- success, `assets touch`, `events send`) is a row of conveyor_asset_events; in the same
-- transaction a row of conveyor_asset_queue for each DAG that consumes its URI. A scheduler
-- turns a DAG's queued rows into one run and deletes them in one transaction, the delete
-- guarded by how many it read: each event starts a DAG's run once, however many schedulers.
-- conveyor_asset_refs: which DAG produces (a task's outlets) and consumes (its schedule)
-- which URI, as the schedulers last recorded it. An event's URI is `event:NAME`.
CREATE TABLE conveyor_asset_events (
    event_id     BIGSERIAL PRIMARY KEY,
    uri          TEXT NOT NULL,
    extra        TEXT NOT NULL,
    source       TEXT NOT NULL,
    dag_id       TEXT,
    run_id       TEXT,
    task_id      TEXT,
    dedupe_key   TEXT,
    created_at   DOUBLE PRECISION NOT NULL,
    UNIQUE (uri, dedupe_key)
);
CREATE INDEX conveyor_asset_events_uri ON conveyor_asset_events (uri, event_id);
CREATE TABLE conveyor_asset_refs (
    dag_id       TEXT NOT NULL,
    uri          TEXT NOT NULL,
    role         TEXT NOT NULL,
    PRIMARY KEY (dag_id, uri, role)
);
CREATE INDEX conveyor_asset_refs_uri ON conveyor_asset_refs (uri, role);
CREATE TABLE conveyor_asset_queue (
    dag_id       TEXT NOT NULL,
    event_id     BIGINT NOT NULL REFERENCES conveyor_asset_events (event_id)
                 ON DELETE CASCADE,
    uri          TEXT NOT NULL,
    PRIMARY KEY (dag_id, event_id)
);

-- name: insert_asset_event
-- A re-sent event with the same dedupe key is no row (and queues nothing).
INSERT INTO conveyor_asset_events (uri, extra, source, dag_id, run_id, task_id, dedupe_key,
                                   created_at)
VALUES (%(uri)s, %(extra)s, %(source)s, %(dag_id)s, %(run_id)s, %(task_id)s, %(dedupe_key)s, %(now)s)
ON CONFLICT (uri, dedupe_key) DO NOTHING
RETURNING event_id;

-- name: queue_asset_event
INSERT INTO conveyor_asset_queue (dag_id, event_id, uri)
SELECT dag_id, %(event_id)s, %(uri)s FROM conveyor_asset_refs
 WHERE uri = %(uri)s AND role = 'consumes';

-- name: asset_event_by_key
SELECT * FROM conveyor_asset_events WHERE uri = %(uri)s AND dedupe_key = %(dedupe_key)s;

-- name: asset_queue
-- The events waiting for each consuming DAG, oldest first.
SELECT q.dag_id AS consumer, e.* FROM conveyor_asset_queue q
  JOIN conveyor_asset_events e ON e.event_id = q.event_id
 ORDER BY q.dag_id, q.event_id
 LIMIT %(limit)s;

-- name: consume_asset_events
-- Taken by a run: the caller checks the count against what it read (else rolls back).
DELETE FROM conveyor_asset_queue
 WHERE dag_id = %(dag_id)s AND event_id >= %(first)s AND event_id <= %(last)s;

-- name: forget_asset_refs
DELETE FROM conveyor_asset_refs WHERE dag_id = %(dag_id)s;

-- name: insert_asset_ref
INSERT INTO conveyor_asset_refs (dag_id, uri, role) VALUES (%(dag_id)s, %(uri)s, %(role)s)
ON CONFLICT (dag_id, uri, role) DO NOTHING;

-- name: prune_asset_queue
-- A DAG no longer scheduled on a URI keeps none of its events queued.
DELETE FROM conveyor_asset_queue
 WHERE dag_id = %(dag_id)s AND uri NOT IN (
       SELECT uri FROM conveyor_asset_refs WHERE dag_id = %(dag_id)s AND role = 'consumes');

-- name: asset_list
SELECT u.uri,
       (SELECT COUNT(*) FROM conveyor_asset_events e WHERE e.uri = u.uri) AS events,
       (SELECT MAX(created_at) FROM conveyor_asset_events e WHERE e.uri = u.uri)
           AS last_event_at,
       (SELECT COUNT(*) FROM conveyor_asset_queue q WHERE q.uri = u.uri) AS queued
  FROM (SELECT uri FROM conveyor_asset_refs
        UNION SELECT DISTINCT uri FROM conveyor_asset_events) u
 ORDER BY u.uri;

-- name: asset_refs
SELECT dag_id, uri, role FROM conveyor_asset_refs ORDER BY uri, role, dag_id;

-- name: asset_events_of
SELECT * FROM conveyor_asset_events WHERE uri = %(uri)s ORDER BY event_id DESC LIMIT %(limit)s;

-- name: asset_event_last
-- The newest event's id (where a triggerer's asset triggers start reading).
SELECT COALESCE(MAX(event_id), 0) AS event_id FROM conveyor_asset_events;

-- name: asset_event_since
-- The first event of a URI recorded after a time, up to an id (an asset trigger's catch-up).
SELECT * FROM conveyor_asset_events
 WHERE uri = %(uri)s AND created_at > %(since)s AND event_id <= %(upto)s
 ORDER BY event_id LIMIT 1;

-- name: asset_events_after
-- The events after an id up to another, oldest first (one read per poll for all asset
-- triggers, and one more while an id below the cursor may yet commit).
SELECT * FROM conveyor_asset_events WHERE event_id > %(after)s AND event_id <= %(upto)s
 ORDER BY event_id LIMIT %(limit)s;

-- name: asset_queue_counts
-- Events waiting for each consuming DAG's condition (the scheduler's metrics).
SELECT dag_id, COUNT(*) AS n FROM conveyor_asset_queue GROUP BY dag_id;

-- name: migration_0018
-- Deferred task instances (scheduler/deferral.py, triggerer/). A task that raises Defer
-- leaves its slot: its instance is `deferred` (its `deadline` is the deferral's timeout) and
-- its trigger a row of conveyor_triggers, which a triggerer claims for a lease it renews
-- (owner, lease_until: a killed triggerer's rows are claimed by another once it lapses).
-- A firing is one UPDATE guarded by owner and fired_at IS NULL (fired once, however many
-- triggerers ran it); it makes the instance due, and a scheduler queues the same attempt
-- again with the payload in `trigger_event` (the task's context.trigger_event).
ALTER TABLE conveyor_task_instances ADD COLUMN trigger_event TEXT;
CREATE TABLE conveyor_triggers (
    ti_id        TEXT PRIMARY KEY REFERENCES conveyor_task_instances (ti_id) ON DELETE CASCADE,
    attempt      INTEGER NOT NULL,
    run_id       TEXT NOT NULL,
    classpath    TEXT NOT NULL,
    kwargs       TEXT NOT NULL,
    timeout_at   DOUBLE PRECISION,
    created_at   DOUBLE PRECISION NOT NULL,
    owner        TEXT,
    lease_until  DOUBLE PRECISION,
    fired_at     DOUBLE PRECISION,
    payload      TEXT
);
CREATE INDEX conveyor_triggers_open ON conveyor_triggers (created_at) WHERE fired_at IS NULL;
DROP INDEX conveyor_ti_unfinished;
CREATE INDEX conveyor_ti_unfinished ON conveyor_task_instances (run_id)
    WHERE state IN ('pending', 'queued', 'running', 'up_for_retry', 'deferred');

-- name: ti_defer
-- The attempt deferred itself: no worker holds it; its deadline is the deferral's timeout
-- (NULL: none), when the scheduler fails it unless its trigger fired.
UPDATE conveyor_task_instances
   SET state = 'deferred', deadline = %(timeout_at)s, heartbeat_at = NULL, trigger_event = NULL
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state IN ('queued', 'running');

-- name: insert_trigger
INSERT INTO conveyor_triggers (ti_id, attempt, run_id, classpath, kwargs, timeout_at,
                               created_at)
VALUES (%(ti_id)s, %(attempt)s, %(run_id)s, %(classpath)s, %(kwargs)s, %(timeout_at)s, %(now)s)
ON CONFLICT (ti_id) DO UPDATE
   SET attempt = excluded.attempt, run_id = excluded.run_id, classpath = excluded.classpath,
       kwargs = excluded.kwargs, timeout_at = excluded.timeout_at,
       created_at = excluded.created_at, owner = NULL, lease_until = NULL, fired_at = NULL,
       payload = NULL;

-- name: trigger_of
SELECT * FROM conveyor_triggers WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s;

-- name: ti_resume
-- Its trigger fired: the same attempt queued again (a new segment), claimed for publishing,
-- with the trigger's payload for its context.
UPDATE conveyor_task_instances
   SET state = 'queued', queued_at = %(now)s, published_at = NULL, heartbeat_at = NULL,
       hostname = NULL, pid = NULL, waiting_for = NULL, trigger_event = %(payload)s,
       claimed_by = %(scheduler)s, deadline = %(now)s + %(lease)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'deferred'
RETURNING *;

-- name: forget_trigger
DELETE FROM conveyor_triggers WHERE ti_id = %(ti_id)s;

-- name: claim_triggers
-- Unfired triggers nobody holds (new, released, or their triggerer's lease lapsed), oldest
-- first. The guard is repeated outside the subquery: of two triggerers racing for a row,
-- the second finds it taken (Postgres re-checks it on the updated row) and skips it.
UPDATE conveyor_triggers SET owner = %(owner)s, lease_until = %(now)s + %(lease)s
 WHERE fired_at IS NULL AND (owner IS NULL OR lease_until <= %(now)s)
   AND ti_id IN (SELECT ti_id FROM conveyor_triggers
                  WHERE fired_at IS NULL AND (owner IS NULL OR lease_until <= %(now)s)
                    AND EXISTS (SELECT 1 FROM conveyor_task_instances t
                                 WHERE t.ti_id = conveyor_triggers.ti_id
                                   AND t.attempt = conveyor_triggers.attempt
                                   AND t.state = 'deferred')
                  ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING ti_id, attempt, run_id, classpath, kwargs, timeout_at;

-- name: renew_triggers
-- A triggerer's lease on what it runs, renewed; what it still holds (a trigger gone: its
-- task resumed or timed out; taken: its lease had lapsed; its task no longer deferred in
-- that attempt: cleared, cancelled or marked, the row left for no one to run).
UPDATE conveyor_triggers SET lease_until = %(now)s + %(lease)s
 WHERE owner = %(owner)s AND fired_at IS NULL
   AND EXISTS (SELECT 1 FROM conveyor_task_instances t
                WHERE t.ti_id = conveyor_triggers.ti_id
                  AND t.attempt = conveyor_triggers.attempt AND t.state = 'deferred')
RETURNING ti_id, attempt;

-- name: fire_trigger
UPDATE conveyor_triggers SET fired_at = %(now)s, payload = %(payload)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND owner = %(owner)s AND fired_at IS NULL;

-- name: ti_trigger_fired
-- Due now: the scheduler's next tick resumes it.
UPDATE conveyor_task_instances SET deadline = %(now)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND state = 'deferred';

-- name: release_triggers
-- A triggerer stopping: what it held is for another at once, not after its lease.
UPDATE conveyor_triggers SET owner = NULL, lease_until = NULL
 WHERE owner = %(owner)s AND fired_at IS NULL;

-- name: trigger_counts
SELECT COUNT(*) AS deferred,
       COALESCE(SUM(CASE WHEN fired_at IS NULL AND owner IS NOT NULL
                          AND lease_until > %(now)s THEN 1 ELSE 0 END), 0) AS running,
       COALESCE(SUM(CASE WHEN fired_at IS NOT NULL THEN 1 ELSE 0 END), 0) AS fired
  FROM conveyor_triggers;

-- name: trigger_failed
-- Its trigger raised (or cannot be imported): held by no triggerer again, the error kept
-- for the scheduler to fail the task with.
UPDATE conveyor_triggers SET owner = 'failed', lease_until = NULL, payload = %(error)s
 WHERE ti_id = %(ti_id)s AND attempt = %(attempt)s AND owner = %(owner)s AND fired_at IS NULL;

-- name: migration_0019
-- Fired triggers whose task a scheduler has yet to resume, found without a scan.
CREATE INDEX conveyor_triggers_fired ON conveyor_triggers (fired_at) WHERE fired_at IS NOT NULL;

-- name: fired_deferred
-- Deferred attempts whose trigger fired, with its payload: resumed in a batch per tick.
SELECT t.*, g.payload AS fired_payload FROM conveyor_triggers g
  JOIN conveyor_task_instances t ON t.ti_id = g.ti_id AND t.attempt = g.attempt
 WHERE g.fired_at IS NOT NULL AND t.state = 'deferred'
 ORDER BY g.fired_at LIMIT %(limit)s;
