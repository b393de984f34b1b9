"""The ledger service: the accounts aggregate with Enhydra's runtime around it."""

from enhydra import Service
from ledger.domain import accounts

service = Service("ledger", accounts)
