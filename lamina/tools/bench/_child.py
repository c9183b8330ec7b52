"""The process of one library's ``timing.Child`` (Note [Separate processes] in
lamina.tools.bench.timing): ``python -m lamina.tools.bench._child MODULE LIBRARY CONFIG``."""

import json
import sys

from .timing import child_main

if __name__ == "__main__":
    module, library, config = sys.argv[1:]
    child_main(module, library, json.loads(config))
