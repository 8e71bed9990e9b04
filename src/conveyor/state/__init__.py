"""The state store: runs, task instances and their attempts, and the worker registry.

Shared by the scheduler (its only source of truth), the workers (each writes its heartbeat
row) and the operator commands (`status`, `runs`, `tasks`), so it sits below all of them:
a worker registering itself does not import the scheduler.

Read and write it through the repositories, which return frozen records:
`runs` (Dags, Runs), `tasks` (TaskInstances, Attempts), `monitoring` (Workers, Schedulers,
QueueSamples, Scalers, Results); `store` opens the connection and brackets transactions.
"""
