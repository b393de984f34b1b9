"""One SQL projection engine in its own process, for the kill -9 tests: runs until SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal

from enhydra.settings import Settings
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.engine import SqlProjectionEngine
from tests.sql.accounts import PROJECTION


async def main() -> None:
    engine = SqlProjectionEngine(
        Settings.from_env(),
        PROJECTION,
        os.environ["TEST_EVENTS_TOPIC"],
        database=DatabaseSettings.from_env(),
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await engine.start()
    await stop.wait()
    await engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
