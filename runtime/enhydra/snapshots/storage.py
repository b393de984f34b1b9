"""Where snapshots live: a local (or shared) folder, or S3-compatible object storage.

A snapshot is a prefix holding manifest.json and the partition files. Partition files may be
written by several instances at once; the manifest is written last, in one atomic step (a
rename on a filesystem, a single PUT on S3), so a reader never sees a partial snapshot.
A partition file is never replaced: when a partition moves during a live snapshot, its old and
new owner may both export it, and the manifest describes the copy that was placed first.

    file:///var/backups/snapshots    or simply /var/backups/snapshots
    s3://bucket/prefix?endpoint_url=http://127.0.0.1:9000&region=us-east-1
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs, urlparse

from enhydra.snapshots.format import MANIFEST, PartitionTaken, SnapshotError

SINGLE_PUT_LIMIT = 5 * 1024**3  # S3's largest single PUT; a conditional write must be one


class Storage(Protocol):
    url: str

    def put_file(self, rel: str, local: Path) -> None:
        """Place a partition file, unless one is there already (PartitionTaken)."""

    def put_manifest(self, snapshot_id: str, data: bytes) -> None: ...

    def fetch(self, snapshot_id: str, into: Path) -> Path: ...

    def list_snapshots(self) -> list[str]: ...

    def delete(self, snapshot_id: str) -> None: ...

    def local_dir(self, snapshot_id: str) -> Path | None: ...


def _check_rel(rel: str) -> str:
    parts = Path(rel).parts
    if rel.startswith("/") or ".." in parts or not parts:
        raise SnapshotError(f"refusing path {rel!r}: snapshot paths are relative, without '..'")
    return rel


class FileStorage:
    """A folder (local or a shared mount); partition files are written in place."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self.url = f"file://{self.root}"

    def local_dir(self, snapshot_id: str) -> Path:
        return self.root / _check_rel(snapshot_id)

    def put_file(self, rel: str, local: Path) -> None:
        target = self.root / _check_rel(rel)
        if local.resolve() == target:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(local, tmp)
        try:
            os.link(tmp, target)  # fails if the target exists: the first writer wins
        except FileExistsError:
            raise PartitionTaken(f"{rel} was written by another instance first") from None
        finally:
            tmp.unlink(missing_ok=True)

    def put_manifest(self, snapshot_id: str, data: bytes) -> None:
        directory = self.local_dir(snapshot_id)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{MANIFEST}.{os.getpid()}.tmp"
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, directory / MANIFEST)

    def fetch(self, snapshot_id: str, into: Path) -> Path:
        return self.local_dir(snapshot_id)  # already local: read in place

    def list_snapshots(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / MANIFEST).is_file())

    def delete(self, snapshot_id: str) -> None:
        shutil.rmtree(self.local_dir(snapshot_id), ignore_errors=True)


class S3Storage:
    """An S3 bucket and prefix (AWS, MinIO, Ceph, moto...), through boto3."""

    def __init__(self, bucket: str, prefix: str, *, endpoint_url: str | None, region: str | None):
        try:
            import boto3
        except ImportError:
            raise SnapshotError("S3 storage needs boto3: pip install 'enhydra[s3]'") from None
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        query = f"?endpoint_url={endpoint_url}" if endpoint_url else ""
        self.url = f"s3://{bucket}/{self.prefix}{query}"
        self._s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name=region or "us-east-1")

    def _key(self, rel: str) -> str:
        rel = _check_rel(rel)
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def local_dir(self, snapshot_id: str) -> None:
        return None

    def put_file(self, rel: str, local: Path) -> None:
        """A conditional PUT (If-None-Match: *, honoured by AWS S3 since 2024 and by MinIO)."""
        from botocore.exceptions import ClientError

        key = self._key(rel)
        if local.stat().st_size > SINGLE_PUT_LIMIT:  # multipart: checked first, not atomic
            if self._exists(key):
                raise PartitionTaken(f"{rel} was written by another instance first")
            self._s3.upload_file(str(local), self.bucket, key)
            return
        for attempt in range(5):
            try:
                with local.open("rb") as body:
                    self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
                return
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code == "PreconditionFailed":
                    raise PartitionTaken(f"{rel} was written by another instance first") from None
                if code != "ConditionalRequestConflict" or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))  # a concurrent write of the same key: retry

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._s3.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def put_manifest(self, snapshot_id: str, data: bytes) -> None:
        self._s3.put_object(
            Bucket=self.bucket, Key=self._key(f"{snapshot_id}/{MANIFEST}"), Body=data
        )

    def fetch(self, snapshot_id: str, into: Path) -> Path:
        """Download a snapshot's objects into `into/<id>`; only known names are accepted."""
        target = into / _check_rel(snapshot_id)
        prefix = self._key(snapshot_id) + "/"
        paginator = self._s3.get_paginator("list_objects_v2")
        found = False
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :]
                local = target / _check_rel(rel)
                local.parent.mkdir(parents=True, exist_ok=True)
                self._s3.download_file(self.bucket, obj["Key"], str(local))
                found = True
        if not found:
            raise SnapshotError(f"no snapshot {snapshot_id!r} under {self.url}")
        return target

    def list_snapshots(self) -> list[str]:
        prefix = f"{self.prefix}/" if self.prefix else ""
        paginator = self._s3.get_paginator("list_objects_v2")
        ids = set()
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :]
                if rel.endswith("/" + MANIFEST):
                    ids.add(rel[: -len(MANIFEST) - 1])
        return sorted(ids)

    def delete(self, snapshot_id: str) -> None:
        prefix = self._key(snapshot_id) + "/"
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            if keys:
                self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": keys})


def open_storage(url: str) -> FileStorage | S3Storage:
    """Storage from a URL: a path, file://..., or s3://bucket/prefix[?endpoint_url=...]."""
    if not url:
        raise SnapshotError("no snapshot storage given (ENHYDRA_SNAPSHOT_STORAGE or --storage)")
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return FileStorage(parsed.path if parsed.scheme else url)
    if parsed.scheme == "s3":
        query = parse_qs(parsed.query)
        return S3Storage(
            parsed.netloc,
            parsed.path,
            endpoint_url=query.get("endpoint_url", [None])[0],
            region=query.get("region", [None])[0],
        )
    raise SnapshotError(f"unsupported snapshot storage {url!r}: use a path, file:// or s3://")


def open_snapshot_at(storage: FileStorage | S3Storage, snapshot_id: str) -> Path:
    """A local folder holding the snapshot (downloaded to a temp dir for remote storage)."""
    local = storage.local_dir(snapshot_id)
    if local is not None:
        return local
    return storage.fetch(snapshot_id, Path(tempfile.mkdtemp(prefix="enhydra-snapshot-")))
