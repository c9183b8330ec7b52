"""Command-line tools: ``python -m lamina.overhead`` (where the time of a call goes)
and ``python -m lamina.demo`` (a short tour)."""
