"""`conveyor ui`: the web dashboard, served from the state store and the broker.

Runs, DAGs, dead letters, queues, limits and workers in a browser, updating live, over the
same JSON API scripts can use (`/api` lists it). It binds 127.0.0.1 unless given --host.
Reading needs nothing; actions (retry, clear or mark a task, requeue, purge, trigger, pause,
set a limit) need the token the operator sets in `ui_token`
(CONVEYOR_UI_TOKEN, or the config file: never a flag, which `ps` would show). Without one the
dashboard is read-only and says why.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from conveyor.config import env_flag, read
from conveyor.errors import ConveyorError
from conveyor.locations import listening
from conveyor.scheduler.config import SchedulerConfig
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.server import Server, serve

log = logging.getLogger("conveyor.ui")
TOKEN_ENV = "CONVEYOR_UI_TOKEN"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("ui", help="the web dashboard: runs, DAGs, dead letters",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    env_flag(p, env="CONVEYOR_BROKER_URL")
    env_flag(p, env="CONVEYOR_STATE_URL")
    env_flag(p, env="CONVEYOR_DAGS_FOLDER")
    env_flag(p, env="CONVEYOR_EXECUTORS")
    env_flag(p, env="CONVEYOR_UI_HOST")
    env_flag(p, env="CONVEYOR_UI_PORT")
    env_flag(p, env="CONVEYOR_LOG_LEVEL")
    p.add_argument("-Q", "--queue", action="append", default=[],
                   help="also show this queue's dead letters (repeatable)")
    p.set_defaults(run=run_ui)


def token() -> str:
    return str(read(TOKEN_ENV) or "").strip()


def dashboard(broker: str, state: str, dags_folder: str, executors: str,
              queues: tuple[str, ...] = ()) -> Dashboard:
    scheduler = SchedulerConfig.from_env(broker_url=broker or None, state_url=state or None,
                                         dags_folder=dags_folder, executors=executors)
    return Dashboard(UiConfig(scheduler, token(), queues))


def bind(ui: Dashboard, host: str, port_number: int, flag: str) -> Server:
    """The server, bound; a taken port or a wrong address is one line, exit 2."""
    with listening("the dashboard", host, port_number, flag):
        return serve(ui, host, port_number)


def reach(ui: Dashboard) -> None:
    """Open the state store and the broker once, in the background, as the dashboard starts:
    one that cannot reach them says so in its log within seconds (the broker's first contact,
    see `broker/reconnect.py`), not only on the pages that need them; each page keeps trying
    on its own."""
    def attempt() -> None:
        try:
            with ui.store(), ui.broker():
                pass
        except ConveyorError as exc:
            log.error("the dashboard cannot reach what it shows: %s; its pages say so until "
                      "it can", exc)
    threading.Thread(target=attempt, name="ui-reach", daemon=True).start()


def run_ui(args: argparse.Namespace) -> int:
    ui = dashboard(args.broker, args.state, args.dags_folder, args.executors,
                   tuple(args.queue))
    server = bind(ui, args.host, args.port, "--port")
    reach(ui)
    mode = "actions need the token" if ui.config.token else \
        f"read-only (set {TOKEN_ENV} to allow actions)"
    print(f"conveyor ui: serving {server.address} ({mode}); Ctrl-C stops", flush=True)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        ui.close()
    print("conveyor ui: stopped", file=sys.stderr, flush=True)
    return 0
