"""The revenue DAG as a DAG file: `conveyor scheduler --dags-folder <this folder>`.

Its ledger (side-effect log) and the flaky task's seed come from the scheduler's environment
when the file is loaded: CONVEYOR_REVENUE_LEDGER, CONVEYOR_REVENUE_SEED, and how long
clean_orders takes: CONVEYOR_REVENUE_PAUSE (seconds).
"""

import os

from conveyor.scheduler.examples.revenue import build

dag = build("revenue", ledger=os.environ.get("CONVEYOR_REVENUE_LEDGER", ""),
            seed=int(os.environ.get("CONVEYOR_REVENUE_SEED", "0")),
            pause=float(os.environ.get("CONVEYOR_REVENUE_PAUSE", "0")), retry_delay=0.2)
