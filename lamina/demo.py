"""``python -m lamina.demo``: see lamina.tools.demo."""

from lamina.tools.demo import main

if __name__ == "__main__":
    main()
