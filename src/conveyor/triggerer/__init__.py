"""`conveyor triggerer`: runs the triggers of deferred tasks (see daemon.py)."""
