"""Write topology.json: the topology of the service as generated, the baseline of upgrades.

CI runs `enhydra topology check --against topology.json` on every change, so a change that
cannot be rolled out instance by instance (partition count, store name, key type...) fails
before it is deployed. The file is written by Enhydra itself from the generated code, so it
always matches it; ENHYDRA_* variables of the shell are ignored (the code's defaults count).
"""

from __future__ import annotations

import os
import subprocess
import sys

TARGET = {{ (cookiecutter.package_name ~ ".service:service") | tojson }}


def main() -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENHYDRA_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "enhydra.cli.main", "topology", "show", TARGET]
    result = subprocess.run(
        [*command, "--output", "topology.json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        print(
            f"warning: could not write topology.json ({result.stderr.strip()[-500:]}); "
            f"write it with: enhydra topology show {TARGET} -o topology.json",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
