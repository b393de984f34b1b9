"""`python -m {{ cookiecutter.package_name }}` runs one worker (settings from ENHYDRA_* variables)."""

from {{ cookiecutter.package_name }}.service import service

if __name__ == "__main__":
    service.run()
