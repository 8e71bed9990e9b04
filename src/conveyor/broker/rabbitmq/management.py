"""The management-plugin client: the one call `depth` needs (a queue family's unacked counts).

AMQP has no unacked count: only the management plugin knows how many deliveries other
connections hold. `depth` asks it only when other connections consume the queue (see
`broker`); RabbitMQ refreshes these statistics every few seconds. Stdlib urllib keeps the
transport free of an HTTP client dependency.

On a cluster every node's management API answers for the whole cluster, so the client is
given one base URL per node and follows the one that answers: it asks the node that
answered last, and on a connection error (or a 5xx: a node booting or stopping) the next one,
in turn; an HTTP refusal (401, 404) is an answer and is not retried elsewhere. When none
answers, the error names each and why.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlencode
from urllib.request import Request, urlopen

from conveyor.errors import BrokerError


class ManagementAPI:
    """The one management-plugin call depth needs: a queue family's names and unacked counts.

    Only the management plugin knows how many deliveries other connections hold; AMQP does
    not say. Stdlib urllib keeps the transport free of an HTTP client dependency.
    """

    def __init__(self, base: str | Sequence[str], user: str, password: str, vhost: str,
                 timeout: float = 5.0) -> None:
        """`base`: the management API's base URL, or one per node of a cluster."""
        self.bases = (base,) if isinstance(base, str) else tuple(base)
        self._at = 0  # the node that answered last
        self.user = user
        self.vhost = vhost
        self.timeout = timeout
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._auth = f"Basic {token}"

    def queue_family(self, queue: str) -> dict[str, dict[str, Any]]:
        """`queue`, its priority bands, dead queue and delay levels that exist: name ->
        statistics."""
        pattern = f"^{re.escape(queue)}(\\.dead|\\.delay\\.[0-9]+|\\.pri\\.[0-9]+)?$"
        # The name filter only applies to a paginated listing; a family has < 30 queues.
        query = urlencode({"name": pattern, "use_regex": "true", "page": 1, "page_size": 500,
                           "columns": "name,messages_unacknowledged"})
        page = self._get(f"/api/queues/{quote(self.vhost, safe='')}?{query}", queue)
        rows = page.get("items", []) if isinstance(page, dict) else page
        family = re.compile(pattern)  # and filter here too, whatever the server did
        return {row["name"]: row for row in rows
                if isinstance(row, dict) and family.match(str(row.get("name", "")))}

    def dead_queues(self) -> list[str]:
        """The queues whose dead queue (`<queue>.dead`) holds messages now."""
        query = urlencode({"name": r"\.dead$", "use_regex": "true", "page": 1,
                           "page_size": 500, "columns": "name,messages"})
        page = self._get(f"/api/queues/{quote(self.vhost, safe='')}?{query}", "*.dead",
                         "list the queues holding dead letters")
        rows = page.get("items", []) if isinstance(page, dict) else page
        return sorted(str(row["name"])[:-len(".dead")] for row in rows
                      if isinstance(row, dict) and str(row.get("name", "")).endswith(".dead")
                      and row.get("messages"))

    @property
    def base(self) -> str:
        """The base URL of the node that answered last (the first, before any answered)."""
        return self.bases[self._at]

    def _get(self, path: str, queue: str, what: str = "") -> Any:
        """GET `path` from the node that answered last, else the next that answers; `what`
        the call was for, in its errors (default: counting the in-flight messages of
        `queue`)."""
        what = what or f"count in-flight messages of queue {queue!r}"
        failures: list[str] = []
        for step in range(len(self.bases)):
            at = (self._at + step) % len(self.bases)
            try:
                found = self._get_from(self.bases[at], path)
            except HTTPError as exc:
                exc.close()
                if exc.code < 500:
                    self._at = at
                    raise BrokerError(self._http_problem(exc.code, queue)) from exc
                failures.append(f"{self.bases[at]} answered HTTP {exc.code}")
            except (URLError, OSError, ValueError) as exc:
                failures.append(f"{self.bases[at]} is unreachable ({exc})")
            else:
                self._at = at
                return found
        where = (failures[0] if len(failures) == 1 else
                 "no node's management API answered: " + "; ".join(failures))
        raise BrokerError(
            f"cannot {what}: the RabbitMQ management API at {where}. RabbitMQ reports "
            "unacknowledged deliveries only through its management plugin: enable it with "
            "`rabbitmq-plugins enable rabbitmq_management`, or point the broker URL's "
            "?management=http://host:15672 at it (a cluster: one per node, comma-separated)")

    def _get_from(self, base: str, path: str) -> Any:
        request = Request(base + path, headers={"Authorization": self._auth})
        with urlopen(request, timeout=self.timeout) as response:
            return json.load(response)

    def _http_problem(self, status: int, queue: str) -> str:
        if status in (401, 403):
            return (f"the RabbitMQ management API at {self.base} refused user {self.user!r} "
                    f"(HTTP {status}) while measuring queue {queue!r}: give the user the "
                    f"'monitoring' tag (rabbitmqctl set_user_tags {self.user} monitoring) and "
                    f"access to vhost {self.vhost!r}")
        return (f"the RabbitMQ management API at {self.base} answered HTTP {status} while "
                f"measuring queue {queue!r} in vhost {self.vhost!r}")
