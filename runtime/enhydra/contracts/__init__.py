"""What crosses a process or product boundary, defined once: stream and batch must agree on it.

    headers.py      the headers the runtime puts on events and reads back (fold, projections)
    codec.py        the stored entry (state + bookkeeping) and its bytes
    partitioner.py  Kafka's default partitioner (murmur2): where a key lives, and a record
                    that is not there
    fingerprint.py  the fingerprint of a topology: "same layout" for upgrades and snapshots
    names.py        names derived from an application id
    sizes.py        how big a record is to a broker (checked against max.message.bytes)

Pure and light: importable on a Spark executor with nothing but the standard library and orjson.
"""
