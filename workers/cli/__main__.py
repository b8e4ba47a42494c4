"""`python -m workers.cli ...` is `tempered ...` (how `workers.background` starts workers)."""

from workers.cli import main

main()
