"""What operators look at, read once for every way of showing it.

The CLI's tables (`conveyor status`, `runs`, `dead-letters`) and the web dashboard
(`conveyor.ui`) show the same rows: queue depths, registered workers, runs with their task
instances, dead letters with their reasons. The functions that read and shape those rows live
here, below both, so the two never drift apart. Each returns plain JSON-ready data; how to
print or render it stays with the caller.
"""
