"""Warm the zygote with what every fresh runner would otherwise redo on its own.

A runner is a fork of its lane, and the lane a fork of the zygote: whatever the zygote has
loaded, resolved or cached before forking, every runner inherits for free, while whatever a
runner does for itself dies with it and the next runner does it again. Measured on the real
path (benchmarks/runner_breakdown.py), a fresh runner whose task opens one Redis client
spent ~8 ms of its ~12 ms on work that is the same in every runner:

* the name service: the first getaddrinfo loads the NSS modules, reads nsswitch.conf and
  gai.conf, and imports the `idna` codec (Python encodes host names with it);
* `importlib.metadata.version()`: client libraries ask for their own version on every new
  connection (redis-py for CLIENT SETINFO), an uncached scan of sys.path that also imports
  the `email` parser to read METADATA. The zygote memoises it: a version cannot change
  under a running worker (its modules are already imported from that installation);
* small stdlib modules that client libraries import lazily inside their connect paths.

Nothing here opens a connection or holds a secret: the zygote runs in the scrubbed
environment and its memory is every runner's memory.
"""

from __future__ import annotations

import functools
import gc
import importlib
import socket
import sys
from collections.abc import Callable
from typing import Any

# Imported lazily on a fresh runner's first connection, seen in an strace of one (redis-py
# imports `secrets` for its pool id; Python imports `encodings.idna`/`stringprep` for host
# names; importlib.metadata imports the `email` parser to read METADATA). Only these: every
# module here is memory in the zygote, counted in the worker's footprint.
LAZY_STDLIB = ("secrets", "encodings.idna", "stringprep")
#: Only when the app's libraries use importlib.metadata (they imported it): its scan and the
#: `email` parser are ~2 MiB in every worker that never asks for a version.
METADATA_STDLIB = ("email.parser", "email.feedparser")


def warm() -> None:
    """Everything below, each step best effort: a failed warm-up only costs speed."""
    for step in (_import_lazy_stdlib, _resolve_names, _memoise_versions):
        try:
            step()
        except Exception:  # noqa: BLE001, S112 - a warm-up must never stop the worker
            continue


def freeze() -> None:
    """Collect, then move every object to the permanent generation: a runner's collections
    then never write to (and so never copy) the pages the zygote filled."""
    gc.collect()
    gc.freeze()


def _import_lazy_stdlib() -> None:
    for name in LAZY_STDLIB:
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def _resolve_names() -> None:
    """One lookup of each kind loads the resolver's modules and configuration for good."""
    for host in ("127.0.0.1", "localhost"):
        try:
            socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        except OSError:
            continue


def _memoise_versions() -> None:
    """Cache `importlib.metadata.version` and fill it for the distributions imported, if a
    library of the app asks for versions at all (it imported importlib.metadata)."""
    if "importlib.metadata" not in sys.modules:
        return
    import importlib.metadata as metadata
    for name in METADATA_STDLIB:
        importlib.import_module(name)
    if not hasattr(metadata.version, "cache_info"):
        metadata.version = _cached(metadata.version)  # type: ignore[assignment]
    imported = {name.partition(".")[0] for name in sys.modules}
    for module, names in metadata.packages_distributions().items():
        for name in names if module in imported else ():
            try:
                metadata.version(name)
            except metadata.PackageNotFoundError:
                continue


def _cached(version: Callable[[str], str]) -> Callable[[str], str]:
    """`version` memoised; a distribution that is not installed is not cached (it may be
    installed while the worker runs, and raising again is cheap)."""
    cached: Callable[[str], Any] = functools.lru_cache(maxsize=512)(version)
    return functools.wraps(version)(cached)
