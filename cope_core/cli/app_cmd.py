"""``cope app``: start the Streamlit explorer (``streamlit run app.py``)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from ..errors import CopeInputError

#: The explorer's entry script, at the root of the source tree next to ``pages/``.
APP_SCRIPT = Path(__file__).resolve().parents[2] / "app.py"


def register(subparsers: argparse._SubParsersAction) -> None:
    s = subparsers.add_parser("app", help="start the Streamlit explorer in the browser")
    s.add_argument("--port", type=int, help="port to serve on (default: Streamlit's, 8501)")
    s.add_argument("--headless", action="store_true", help="do not open a browser window")
    s.add_argument("--dev", action="store_true",
                   help="development: rerun on file changes and show the developer's toolbar "
                        "(off by default: .streamlit/config.toml)")
    s.add_argument("--examples", help="folder of example Parquet files to offer "
                                      "(default: data/examples of the source tree)")
    s.add_argument("--print-command", action="store_true",
                   help="print the command instead of running it")
    s.set_defaults(func=cmd_app)


def app_command(port: int | None = None, headless: bool = False,
                script: Path = APP_SCRIPT, dev: bool = False) -> list[str]:
    """The ``streamlit run`` command line that serves the explorer."""
    if not script.is_file():
        raise CopeInputError("the explorer's app.py is not there; `cope app` needs the source "
                             "tree (pip install -e .)", source=str(script))
    cmd = [sys.executable, "-m", "streamlit", "run", str(script)]
    if port is not None:
        if not 1 <= port <= 65535:
            raise CopeInputError(f"expected a port in 1..65535, got {port}", field="--port")
        cmd += ["--server.port", str(port)]
    if headless:
        cmd += ["--server.headless", "true"]
    if dev:
        cmd += ["--server.fileWatcherType", "auto", "--client.toolbarMode", "developer"]
    return cmd


def cmd_app(args: argparse.Namespace) -> int:
    cmd = app_command(args.port, args.headless, dev=args.dev)
    env = dict(os.environ)
    if args.examples:
        folder = Path(args.examples)
        if not folder.is_dir():
            raise CopeInputError("is not a folder, expected a folder of Parquet files",
                                 source=str(folder), field="--examples")
        env["COPE_EXAMPLES_DIR"] = str(folder.resolve())
    if args.print_command:
        print(" ".join(cmd))
        return 0
    # the app runs from the source tree so that its relative page paths resolve
    return subprocess.call(cmd, cwd=str(APP_SCRIPT.parent), env=env)
