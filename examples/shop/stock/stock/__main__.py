"""`python -m stock` runs one worker (settings from ENHYDRA_* variables)."""

from stock.service import service

if __name__ == "__main__":
    service.run()
