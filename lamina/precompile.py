"""``python -m lamina.precompile``: see lamina.tools.precompile."""

from lamina.tools.precompile import main

if __name__ == "__main__":
    main()
