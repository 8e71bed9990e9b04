"""Conveyor: a message-broker distributed worker system.

A scheduler decides what runs and when, brokers carry work to named queues, workers run
each task in an isolated, memory-capped, non-dumpable process, and an autoscaler decides
how many workers exist.
"""

__version__ = "0.1.0"
