"""`python -m payments` runs one worker (settings from ENHYDRA_* variables)."""

from payments.service import service

if __name__ == "__main__":
    service.run()
