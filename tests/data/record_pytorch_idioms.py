"""Record PyTorch's result of every idiom in tests/pytorch_idioms.py into
pytorch_idioms.json beside this file (run by hand with torch installed; the test suite
reads the record and needs no PyTorch):

    python tests/data/record_pytorch_idioms.py
"""

import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from pytorch_idioms import IDIOMS, encode, scope

record = {"torch": torch.__version__, "results": {}}
for idiom in IDIOMS:
    try:
        record["results"][idiom] = encode(eval(idiom, scope(torch)))
    except Exception as exc:
        sys.exit(f"{idiom}: {exc}")
out = pathlib.Path(__file__).with_name("pytorch_idioms.json")
out.write_text(json.dumps(record, indent=0, sort_keys=False) + "\n")
print(f"recorded {len(IDIOMS)} idioms with torch {torch.__version__} into {out.name}")
