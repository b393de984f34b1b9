"""Wait until an instance answers /health/ready: `python demo/wait_ready.py URL [SECONDS]`."""

import sys
import time
import urllib.request


def main(url: str, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return 0
        except OSError:
            if time.monotonic() > deadline:
                print(f"{url} not ready after {seconds:.0f} s (see demo.log)", file=sys.stderr)
                return 1
            time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 90.0))
