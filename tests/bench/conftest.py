"""The benchmarks time the tiny exported model of tests/export."""

from tests.export.conftest import tiny_dir

__all__ = ["tiny_dir"]
