"""A store killed mid-write comes back at a consistent checkpoint (RocksDB's WAL is off).

The changelog is the log, so the store does not keep its own: a kill -9 loses what was written
since the last memtable flush. What must hold is that the checkpoint never runs ahead of the
data, so restoring the changelog from the checkpoint on gives back exactly the state. Here
each write sets every key to its batch number with that number as the changelog offset: after
the kill, every key must hold exactly the checkpoint's batch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from enhydra.stores.partition import PartitionStore

WRITER = """
import os, signal, sys
from pathlib import Path
from enhydra.stores.partition import PartitionStore, configure_memory

configure_memory(8)  # small memtables: several flushes happen while writing
store = PartitionStore(Path(sys.argv[1]))
padding = bytes(400)
for batch in range(int(sys.argv[2])):
    value = b"%08d" % batch + padding
    store.write([(b"k%04d" % i, value) for i in range(200)], changelog_offset=batch)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_store_reopens_with_its_data_exactly_at_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    batches = 400  # ~33 MB written, four times the memory budget
    done = subprocess.run([sys.executable, "-c", WRITER, str(path), str(batches)], timeout=120)
    assert done.returncode == -9
    store = PartitionStore(path)
    try:
        checkpoint = store.changelog_offset
        values = {int(value[:8]) for _, value in store.items()}
    finally:
        store.close()
    print(f"checkpoint after the kill: {checkpoint} of {batches - 1}")
    assert 0 <= checkpoint <= batches - 1  # flushes happened; the tail may be lost
    assert values == {checkpoint}
