"""The shared HDF5 result schema: one self-describing file per analysis.

Every result file carries root attrs ``kind``, ``created``, ``landscape_version``, ``torch_version``, ``environment``,
``portable`` (made in portable mode, `landscape.runtime.use_portable`),
``inputs`` (JSON list of ``{"ref", "path", "sha256"}``) and ``params`` (JSON of the analysis options),
plus analysis-specific scalar attrs; datasets are named for what they hold (``alpha``, ``train_loss``).
Array keys may contain ``/`` to form groups. Files are written to a temporary name and renamed, so a
killed process never leaves a half-written result.
"""

# The package is split by concern (core: the file schema, write_result, read_result; codec: the dataclass
# codec and StoredResult; paths: output paths and companion files). Every name the single module
# landscape/results.py had stays importable from landscape.results.

from landscape.hashing import InputRef, sha256_file  # below the store and the results; read here too
from landscape.jsonable import is_tensor, to_jsonable
from landscape.results.codec import (
    _BY_NAME,
    StoredResult,
    _column_array,
    _decode_value,
    _dict_field,
    _field_values,
    _flatten,
    _group_arrays,
    _key_names,
    _layout,
    _list_of,
    _plain_class,
    _read_table,
    _real_parts,
    _row_class,
    _rows_from,
    _split_order,
    _strip,
    _table_length,
    read_dataclass,
    stored,
    table_columns,
    write_csv,
    write_dataclass,
)
from landscape.results.core import (
    _RESERVED,
    Result,
    _attach_scales,
    _attr_value,
    _decode_attr,
    _longest_columns,
    _torch_version,
    atomic_write,
    read_result,
    write_result,
)
from landscape.results.paths import (
    DERIVED_BYTES,
    FIGURE_SUFFIXES,
    NAME_MAX,
    PATH_MAX,
    _shown,
    check_companions,
    check_output_path,
    companions,
    is_result_file,
)

__all__ = [
    "InputRef", "is_tensor", "sha256_file", "to_jsonable",
    "DERIVED_BYTES", "FIGURE_SUFFIXES", "NAME_MAX", "PATH_MAX", "Result", "StoredResult", "atomic_write",
    "check_companions", "check_output_path", "companions", "is_result_file", "read_dataclass",
    "read_result", "stored", "table_columns", "write_csv", "write_dataclass", "write_result",
]
# importable as before the split; not part of the API
__all__ += [
    "_BY_NAME", "_RESERVED", "_attach_scales", "_attr_value", "_column_array", "_decode_attr",
    "_decode_value", "_dict_field", "_field_values", "_flatten", "_group_arrays", "_key_names", "_layout",
    "_list_of", "_longest_columns", "_plain_class", "_read_table", "_real_parts", "_row_class",
    "_rows_from", "_shown", "_split_order", "_strip", "_table_length", "_torch_version",
]
