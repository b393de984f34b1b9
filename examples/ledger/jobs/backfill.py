"""Rebuild the ledger's accounts from its events topic, with PySpark.

The job folds `ledger-events` through the service's own `apply` (ledger/domain.py), so batch
and stream cannot disagree. It writes the state as Parquet (--output, for analytics) and/or an
Enhydra snapshot (--snapshot: manifest + one Parquet file per store partition, with the cut on
the commands topic) that a new version of the service can start from. It is `enhydra backfill
ledger.service:service` with the target filled in; `--help` lists the options. Needs
`pip install "enhydra[spark]"` and Java 17.

On a laptop (local[*]; Spark's Kafka connector is fetched once with Maven, else a Python
reader is used):

    python jobs/backfill.py --snapshot snapshots/full --output state.parquet
    python jobs/backfill.py --until-time 2025-01-31T00:00:00Z --snapshot snapshots/jan

On a cluster the job ships its code (this package and Enhydra's pure parts) to the executors,
whose Python needs only pyspark, pyarrow and orjson (docs/backfill.md in Enhydra):

    PYSPARK_PYTHON=/usr/bin/python3 python jobs/backfill.py --master spark://spark:7077 \\
        --bootstrap kafka-1:9092 --output s3a://bucket/ledger/state
    spark-submit --master yarn --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \\
        jobs/backfill.py --bootstrap kafka-1:9092 --output hdfs:///ledger/state

--snapshot must be a directory that the driver and every executor see at the same path (a
shared volume): the executors write the partition files, the driver writes the manifest last.
"""

import sys
from pathlib import Path

from enhydra.cli.backfill import main

PROJECT_ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    sys.path.insert(0, str(PROJECT_ROOT))
    main("ledger.service:service", pythonpath=[str(PROJECT_ROOT)])
