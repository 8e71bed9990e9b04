"""Example DAGs and the tasks they run (the revenue DAG of the project's scenarios)."""
