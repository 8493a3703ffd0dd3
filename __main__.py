"""``python -m graftkit`` (and ``accelerate launch -m graftkit``): the command line."""

from .cli import main

if __name__ == "__main__":
    main()
