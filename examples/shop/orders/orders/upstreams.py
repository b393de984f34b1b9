"""The app ids of the services this one reacts to.

`SHOP_PREFIX` is put before each name, as in ENHYDRA_APP_ID: tests run several shops on one
broker, each under its own prefix. Unset, the upstreams are plainly `stock` and `payments`.
"""

import os


def app_id(name: str) -> str:
    return os.environ.get("SHOP_PREFIX", "") + name
