"""``rlpost board [--runs DIR] [--host H] [--port P] [--allow-launch]``"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import socket
import sys
from pathlib import Path

DEFAULT_PORT = 8470


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="rlpost board",
        description="A local web UI over run directories: runs, curves, samples, launch.",
    )
    p.add_argument("--runs", default="outputs", help="the runs root (default: outputs)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1); any other needs the printed token",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    p.add_argument(
        "--allow-launch",
        action="store_true",
        help="let the launch page start and stop runs (off: it only checks configs)",
    )
    return p.parse_args(argv)


# Addresses that bind every interface: no browser opens them, another machine uses a name.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def url(host: str, port: int, token: str | None) -> str:
    """The board's address on ``host`` (an IPv6 address in brackets), with the token."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def listening(host: str, port: int, token: str | None) -> str:
    """What the start line says: the address bound, as given; on a wildcard address
    also the URL another machine opens, by this machine's name."""
    if host not in WILDCARD_HOSTS:
        return url(host, port, token)
    return (
        f"{url(host, port, token)} (every address of this machine; from another: "
        f"{url(socket.gethostname(), port, token)})"
    )


async def serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    from rlpost.board.server import LOCAL_HOSTS, Board, make_app

    token = None if args.host in LOCAL_HOSTS else secrets.token_urlsafe(24)
    root = Path(args.runs).expanduser().resolve()
    board = Board(root=root, token=token, allow_launch=args.allow_launch)
    runner = web.AppRunner(make_app(board), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    port = sockets[0].getsockname()[1] if sockets else args.port
    launch = "on" if args.allow_launch else "off (--allow-launch to enable)"
    print(
        f"rlpost board: {listening(args.host, port, token)}  (runs {root}; launching {launch})",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        print("error: rlpost board needs aiohttp: pip install 'rlpost[board]'", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0
