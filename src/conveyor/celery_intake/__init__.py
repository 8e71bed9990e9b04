"""Celery intake: run an unchanged Celery producer's tasks on Conveyor workers.

`conveyor worker --celery-queues=celery,reports --celery-broker=redis://… --app myproj.tasks`
takes Celery task protocol 2 (JSON) messages off Celery's queues, turns each into a Conveyor
message for the task registered under the same name, and lets the worker run it like any
other. With `--celery-result-backend=redis://…` outcomes are written back in Celery's result
format, so `AsyncResult(id).get()` in the producer keeps working. See
docs/migrating-from-celery.md for the migration path.

Modules: `protocol` (pure conversion), `feed` (Celery's queues in), `outcomes` and `results`
(results out, rejected messages to dead letters), `intake` (the two threads in the worker),
`names` (its queues). This package imports none of them, so the operator commands can use
`names` without kombu; the worker imports `conveyor.celery_intake.intake` when it needs it.
"""
