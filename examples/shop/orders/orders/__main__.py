"""`python -m orders` runs one worker (settings from ENHYDRA_* variables)."""

from orders.service import service

if __name__ == "__main__":
    service.run()
