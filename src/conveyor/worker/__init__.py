"""The worker: a supervisor that runs each task in an isolated, memory-capped runner."""
