"""{{ cookiecutter.project_name }}: stock items as an Enhydra aggregate (domain.py), run by service.py."""
