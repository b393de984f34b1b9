"""An OAUTHBEARER token provider as a user writes one: the token comes from the environment.

Named by ENHYDRA_SASL_OAUTH_TOKEN_PROVIDER=tests.spark.token_provider:token; the backfill's
driver and its Python workers call it. Executors import it without the runtime (the job ships
its own `enhydra`, so a provider must not need the rest of it), hence the environment: the
test puts an unsigned JWT for the local broker's test-only validator there.
"""

from __future__ import annotations

import os

VARIABLE = "SPARK_TEST_OAUTH_TOKEN"


def token() -> str:
    return os.environ[VARIABLE]
