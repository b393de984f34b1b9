"""Orders: the shop's orders, settled by what stock and payments answer."""
