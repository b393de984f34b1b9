"""Sagas over this and other services' events added by `enhydra generate saga`."""

from orders.sagas.checkout import saga as checkout_saga

SAGAS = [checkout_saga]
