"""The shared HDF5 result schema: one self-describing file per analysis (docs/ARCHITECTURE.md, "Results")."""

from landscape.hashing import InputRef, sha256_file
from landscape.jsonable import to_jsonable
from landscape.results.codec import (
    StoredResult,
    read_dataclass,
    stored,
    table_columns,
    write_csv,
    write_dataclass,
)
from landscape.results.core import Result, atomic_write, read_result, write_result
from landscape.results.paths import check_companions, check_output_path, companions, is_result_file

__all__ = [
    "InputRef", "sha256_file", "to_jsonable", "Result", "StoredResult", "atomic_write", "check_companions",
    "check_output_path", "companions", "is_result_file", "read_dataclass", "read_result", "stored",
    "table_columns", "write_csv", "write_dataclass", "write_result",
]
