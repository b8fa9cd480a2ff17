"""``python -m training data|train|eval|router ...``: the model commands alone.

The same commands as ``quicksilver data``, ``quicksilver train`` and so on, without the
server's dependencies (websockets, faster-whisper, Piper): a GPU host that has PyTorch,
numpy, tokenizers and gguf runs the corpus and the training with a checkout on its
``PYTHONPATH`` (training/gpu_distill.sh).
"""

from __future__ import annotations

import argparse
import logging
import sys

from training.commands import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    rc: int = args.run(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
