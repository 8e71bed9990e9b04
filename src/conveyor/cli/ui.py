"""`conveyor ui`: the web dashboard, served from the state store and the broker.

Runs, DAGs and dead letters in a browser, updating live, over the same JSON API scripts can
use (`/api` lists it). It binds 127.0.0.1 unless given --host. Reading needs nothing;
actions (requeue, purge, trigger, pause) need the token the operator sets in `ui_token`
(CONVEYOR_UI_TOKEN, or the config file: never a flag, which `ps` would show). Without one the
dashboard is read-only and says why.
"""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType

from conveyor.config import env_flag, log_level, lookup, port, url
from conveyor.errors import ConfigError
from conveyor.scheduler.config import SchedulerConfig
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.server import Server, serve

TOKEN_ENV = "CONVEYOR_UI_TOKEN"
#: The dashboard's default port (Airflow's 8080 and Flower's 5555 are often taken).
PORT = 8700


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("ui", help="the web dashboard: runs, DAGs, dead letters",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    env_flag(p, "-b", "--broker", env="CONVEYOR_BROKER_URL", default="", kind=url,
             help="broker URL (default: the embedded SQLite file)")
    env_flag(p, "--state", env="CONVEYOR_STATE_URL", default="", kind=url,
             help="state store URL, sqlite:///… or postgresql://… (default: embedded SQLite)")
    env_flag(p, "--dags-folder", env="CONVEYOR_DAGS_FOLDER", default="dags",
             help="folder of DAG files (for the DAGs page, trigger and pause)")
    env_flag(p, "--executors", env="CONVEYOR_EXECUTORS", default="queue",
             help="comma-separated executors the DAGs may name")
    env_flag(p, "--host", env="CONVEYOR_UI_HOST", default="127.0.0.1",
             help="address to listen on (0.0.0.0: every interface; put TLS in front)")
    env_flag(p, "--port", env="CONVEYOR_UI_PORT", default=PORT, kind=port,
             help="port to listen on (0: any free one, printed)")
    env_flag(p, "--log-level", env="CONVEYOR_LOG_LEVEL", default="INFO", kind=log_level,
             help="log level (DEBUG logs every request)")
    p.add_argument("-Q", "--queue", action="append", default=[],
                   help="also show this queue's dead letters (repeatable)")
    token_setting(p)
    p.set_defaults(run=run_ui)


def token_setting(p: argparse.ArgumentParser) -> None:
    """Record `ui_token` in the settings catalogue (env or file only: no flag)."""
    catalog = getattr(p, "catalog", None)
    if catalog is not None:
        catalog.declare(TOKEN_ENV, default="", command=p.prog.removeprefix("conveyor ").strip(),
                        help="token that dashboard actions (requeue, purge, trigger, pause) "
                             "need; unset: the dashboard is read-only")


def token() -> str:
    return (lookup(TOKEN_ENV)[0] or "").strip()


def dashboard(broker: str, state: str, dags_folder: str, executors: str,
              queues: tuple[str, ...] = ()) -> Dashboard:
    scheduler = SchedulerConfig.from_env(broker_url=broker or None, state_url=state or None,
                                         dags_folder=dags_folder, executors=executors)
    return Dashboard(UiConfig(scheduler, token(), queues))


def bind(ui: Dashboard, host: str, port_number: int, flag: str) -> Server:
    """The server, bound; a taken port or a wrong address is one line, exit 2."""
    try:
        return serve(ui, host, port_number)
    except OSError as exc:
        raise ConfigError(f"cannot serve the dashboard on {host}:{port_number} "
                          f"({exc.strerror}): pass {flag} with a free port") from None


def run_ui(args: argparse.Namespace) -> int:
    ui = dashboard(args.broker, args.state, args.dags_folder, args.executors,
                   tuple(args.queue))
    server = bind(ui, args.host, args.port, "--port")
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
