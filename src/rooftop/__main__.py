"""`python -m rooftop` runs the CLI."""

from rooftop.cli import app

app(prog_name="rooftop")
