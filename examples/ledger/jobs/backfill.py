"""Rebuild the ledger's accounts from its events topic, with PySpark.

The job folds `ledger-events` through the service's own `apply` (ledger/domain.py), so batch
and stream cannot disagree. It writes the state as Parquet (--output, for analytics) and/or an
Enhydra snapshot (--snapshot: manifest + one Parquet file per store partition, with the cut on
the commands topic) that a new version of the service can start from. Needs
`pip install "enhydra[spark]"` and Java 17.

On a laptop (local[*]; Spark's Kafka connector is fetched once with Maven, else a Python
reader is used):

    python jobs/backfill.py --snapshot snapshots/full --output state.parquet
    python jobs/backfill.py --until-time 2025-01-31T00:00:00Z --snapshot snapshots/jan
    enhydra backfill ledger.service:service --until-offsets 0=1200,1=980 --output out

On a cluster (this project and enhydra[spark] installed on every node, e.g. in the image):

    spark-submit --master yarn --deploy-mode cluster \\
        --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version> \\
        jobs/backfill.py --bootstrap kafka-1:9092 --output s3a://bucket/ledger/state

--snapshot must be a directory that the driver and every executor see (a shared volume): the
executors write the partition files, the driver writes the manifest last.
"""

import sys
from pathlib import Path

from enhydra.spark.job import main

PROJECT_ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    sys.path.insert(0, str(PROJECT_ROOT))
    main("ledger.service:service", pythonpath=[str(PROJECT_ROOT)])
