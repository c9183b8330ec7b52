"""The process of one library's ``convnet.Child`` (Note [Separate processes] in
lamina.tools.bench.convnet): ``python -m lamina.tools.bench._child CONFIG``."""

import json
import sys

from .convnet import child_main

if __name__ == "__main__":
    child_main(json.loads(sys.argv[1]))
