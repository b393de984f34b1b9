"""`python -m trade_stats` runs one worker (settings from ENHYDRA_* variables)."""

from trade_stats.service import service

if __name__ == "__main__":
    service.run()
