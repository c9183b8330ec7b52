"""``python -m lamina.bench``: see lamina.tools.bench."""

from lamina.tools.bench import main

if __name__ == "__main__":
    main()
