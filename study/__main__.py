"""`python -m study`: the study queue (`python -m study.queue`), with the same options."""

from study.queue import main

main()
