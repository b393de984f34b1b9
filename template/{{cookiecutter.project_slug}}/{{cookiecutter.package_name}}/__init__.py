"""{{ cookiecutter.project_name }}.

The {{ cookiecutter.aggregate }} aggregate (domain.py), run by service.py.
"""
