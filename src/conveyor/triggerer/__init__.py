"""The triggerer daemon: runs the triggers of deferred tasks (see daemon.py; its command
is conveyor/cli/triggerer.py)."""
