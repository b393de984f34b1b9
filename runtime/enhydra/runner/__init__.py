"""One task runner for every engine: the aggregate's and each projection's.

    tasks.py       a task: one partition's store copy, its role and status
    runner.py      TaskRunner: the consumer, assignment and revocation, restore hand-off through
                   the changelog reader, pause/resume, transient retries, the batch loop
    checkpoint.py  the commit unit of a batch: publish -> persist -> commit, per guarantee
    cuts.py        snapshot cuts: process a partition exactly up to an offset, then hold it
    retries.py     bookkeeping of records retried after transient errors
    rebalance.py   the consumer-group listener that forwards to the runner

A runner is given a pure step (the aggregate's decide/apply batch, a projection's fold) and
everything else is the same for both: the order that loses nothing and applies nothing twice.
"""
