"""``python -m lamina.overhead``: see lamina.tools.overhead."""

from lamina.tools.overhead import main

if __name__ == "__main__":
    main()
