"""The Postgres queue's own VACUUM: every `every` claims, on a session of its own, unwaited.

Why the broker vacuums: a claimed row leaves the ready index and an acked one is deleted, but
their index entries stay until VACUUM removes them, right at the head where every claim
starts reading. Marked dead by the first scan that meets them they are cheap to step over,
yet a claim after a 100,000-message drain still reads hundreds of index pages of them.
Autovacuum may be off, and a busy queue outruns it anyway (it waits for a share of the
table to be dead, and sleeps between pages). So each consumer counts what it claimed and,
every `every` rows, sends `VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED)` on a separate session
without waiting for it, nor for that session's connect (libpq's asynchronous connect,
stepped at each claim, given up after `connect_timeout`): the claims go on meanwhile, a
VACUUM already running (another consumer's, autovacuum's) is skipped, and index cleanup is
forced because on a big table a few thousand dead rows are under the 2% that would let
VACUUM leave the indexes alone.

Each consumer starts counting at a random point of its first `every` claims: consumers that
started together and claim at one pace would otherwise vacuum at the same moments (one
VACUUM runs, the others skip), once per `every` claims of each, so a fleet of N would leave
N x `every` dead entries between two vacuums instead of about `every`.

A session that may not vacuum the table (not its owner) gets a warning from Postgres; that
is logged once, saying what to do, and this consumer stops trying. Any other failure (the
server away) drops the session; the next try comes after another `every` claims.
"""

from __future__ import annotations

import logging
import random
import select
import time

import psycopg
from psycopg import pq

from conveyor.errors import one_line

log = logging.getLogger("conveyor.broker.postgres")

#: Claims between two vacuums of one consumer; the URL option `vacuum_every` (0: never).
DEFAULT_EVERY = 10_000
VACUUM = b"VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) conveyor_messages"
#: A refusal: "skipping ... only table or database owner can vacuum it" (Postgres 15 and
#: older), "permission denied to vacuum ..." (16 on), perhaps with this SQLSTATE.
_NO_PRIVILEGE = "42501"


class Vacuum:
    """Counts claimed rows; starts a VACUUM every `every` of them, steps it at each claim."""

    def __init__(self, conninfo: str, connect_timeout: float, every: int, where: str) -> None:
        self.every = every
        self.where = where
        self._conninfo = conninfo.encode()
        self._connect_timeout = connect_timeout
        self._claimed = random.randrange(every) if every > 0 else 0  # see the docstring
        self._pg: pq.abc.PGconn | None = None
        self._polled = pq.PollingStatus.WRITING  # what the connect waits for next
        self._deadline = 0.0  # monotonic: give the connect up then
        self._sent = False
        self._refused = False
        #: Sessions this object opened for a VACUUM, and VACUUMs it saw the server finish
        #: (tests read them).
        self.started = 0
        self.finished = 0

    @property
    def under_way(self) -> bool:
        """A VACUUM's session is open: connecting, or its VACUUM sent and not yet answered."""
        return self._pg is not None

    def claimed(self, rows: int) -> None:
        """Called after every claim: count, step a VACUUM under way, start one when due."""
        if self.every <= 0 or self._refused:
            return
        self._claimed += rows
        if self._pg is not None:
            self._step()
        if self._pg is None and self._claimed >= self.every:
            self._claimed = 0
            self.started += 1
            self._pg = pq.PGconn.connect_start(self._conninfo)
            self._pg.notice_handler = self._notice
            self._polled, self._sent = pq.PollingStatus.WRITING, False
            self._deadline = time.monotonic() + self._connect_timeout
            self._step()

    def _step(self) -> None:
        """Whatever can be done without waiting: connect, send, or collect the answer."""
        assert self._pg is not None
        try:
            if self._sent:
                self._collect(self._pg)
            elif self._connected(self._pg):
                self._pg.send_query(VACUUM)
                self._sent = True
        except (psycopg.Error, OSError) as exc:
            log.debug("the queue's VACUUM at %s: %s; the next one comes after %d claims",
                      self.where, one_line(exc), self.every)
            self.close()

    def _connected(self, pg: pq.abc.PGconn) -> bool:
        """One step of libpq's asynchronous connect, if its socket is ready for it."""
        if pg.status == pq.ConnStatus.BAD:
            raise psycopg.OperationalError(pg.get_error_message())
        if time.monotonic() > self._deadline:
            raise psycopg.OperationalError(f"no connection within {self._connect_timeout:g} s")
        reading = self._polled == pq.PollingStatus.READING
        ready = select.select([pg.socket] if reading else [], [] if reading else [pg.socket],
                              [], 0)
        if not (ready[0] or ready[1]):
            return False
        self._polled = pq.PollingStatus(pg.connect_poll())
        if self._polled == pq.PollingStatus.FAILED:
            raise psycopg.OperationalError(pg.get_error_message())
        return self._polled == pq.PollingStatus.OK

    def _collect(self, pg: pq.abc.PGconn) -> None:
        """Read what the server sent; once the VACUUM is done, close the session."""
        pg.consume_input()
        if pg.is_busy():
            return
        while (result := pg.get_result()) is not None:
            if result.status != pq.ExecStatus.COMMAND_OK:
                raise psycopg.OperationalError(
                    (result.error_message or b"").decode(errors="replace").strip())
        self.finished += 1
        self.close()

    def _notice(self, result: pq.abc.PGresult) -> None:
        """Postgres skips a table this role may not vacuum with a WARNING, not an error.

        Other warnings are not a refusal: `lock not available` (55P03) is SKIP_LOCKED
        meeting another VACUUM, and one about an old xmin says the server cannot remove
        much; the next try comes after `every` more claims.
        """
        severity, sqlstate, text = (
            (result.error_field(f) or b"").decode(errors="replace")
            for f in (pq.DiagnosticField.SEVERITY_NONLOCALIZED, pq.DiagnosticField.SQLSTATE,
                      pq.DiagnosticField.MESSAGE_PRIMARY))
        if self._refused or severity != "WARNING":
            return
        if sqlstate != _NO_PRIVILEGE and not any(
                word in text for word in ("owner", "permission denied")):
            log.debug("the queue's VACUUM at %s: %s", self.where, text)
            return
        self._refused = True
        log.warning("the Postgres broker at %s may not VACUUM its queue table (%s): claims "
                    "will read more and more dead index entries until autovacuum runs. Run "
                    "the workers as the table's owner, or vacuum conveyor_messages often (or "
                    "add ?vacuum_every=0 to the URL to silence this)", self.where, text)

    def close(self) -> None:
        """Drop the session; a VACUUM still running finishes on the server by itself."""
        if self._pg is not None:
            self._pg.finish()
            self._pg = None
