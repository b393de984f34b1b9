"""Finish the project: vendor the Enhydra runtime, write the topology baseline and the AsyncAPI
document.

With enhydra_source=vendor the running Enhydra's wheel goes into vendor/ and pyproject.toml
points at it (`enhydra upgrade-runtime`), so the project installs wherever it is cloned; a
project that cannot have it is not generated. topology.json, the baseline of upgrades, is
written by Enhydra itself from the generated code (`enhydra topology lock`), marked not
deployed: it follows the code until the first deploy; asyncapi.json (`enhydra asyncapi`) too.
ENHYDRA_* variables of the shell are ignored for both (the code's defaults count).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

SOURCE = {{ cookiecutter.enhydra_source | tojson }}
ENHYDRA = [sys.executable, "-m", "enhydra.cli.main"]


def enhydra(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENHYDRA_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    return subprocess.run(
        [*ENHYDRA, *args], capture_output=True, text=True, env=env, timeout=600, check=False
    )


def write(name: str, *command: str) -> None:
    """Write a file with an enhydra command; a failure is a warning that says how to redo it."""
    done = enhydra(*command)
    if done.returncode == 0:
        print((done.stdout or done.stderr).strip())
    else:
        print(
            f"warning: could not write {name} ({done.stderr.strip()[-500:]}); "
            f"write it with: enhydra {' '.join(command)}",
            file=sys.stderr,
        )


def main() -> int:
    if SOURCE == "vendor":
        vendored = enhydra("upgrade-runtime")
        if vendored.returncode != 0:
            reason = (vendored.stderr or vendored.stdout).strip().splitlines()[-1:]
            print(
                f"error: cannot vendor the Enhydra runtime: {' '.join(reason)} "
                "(with enhydra_source=index the project installs Enhydra from your index)",
                file=sys.stderr,
            )
            return 1
        print(vendored.stdout.strip())
    else:
        shutil.rmtree("vendor", ignore_errors=True)
    write("topology.json", "topology", "lock")
    write("asyncapi.json", "asyncapi", "-o", "asyncapi.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
