"""Data beyond the registry: tensor files, ``imagefolder`` trees, torchvision sets by class name, entry points
and user code (:func:`user_arrays`), each with the provenance its spec records."""

from __future__ import annotations

import inspect
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.data.arrays import _Arrays
from landscape.data.builtin import DATASETS, _images_tensor, _standardize, data_root_of, torchvision_splits
from landscape.errors import DataError, param
from landscape.hashing import sha256_file

ENTRY_POINT_GROUP = "landscape.datasets"
TENSOR_SUFFIXES = (".npz", ".h5", ".hdf5")
TENSOR_KEYS = ("x_train", "y_train", "x_test", "y_test")
IMAGEFOLDER = "imagefolder"


def _other_source(name: Any, seed: int, data_root, download: bool, options: dict, *, stored: dict | None):
    """``(spec name, arrays, options, provenance)`` of a data set that is not built in. ``stored`` (a spec read
    back) decides the kind from its provenance, never from the name alone."""
    from landscape import plugins

    if not isinstance(name, str):
        raise DataError(f"a data set name is a string, got {name!r}")
    kind = _kind_of(name, stored)
    recorded = (stored or {}).get("source") or {}
    if kind == "file":
        path, root = Path(recorded.get("path") or name).expanduser(), data_root_of(data_root)
        if not path.is_file() and recorded and root is not None and (root / path.name).is_file():
            path = root / path.name  # a moved copy (its sha256 is checked like the original's)
        elif not path.is_file():
            moved = (f" (recorded in the checkpoint; {param('data_root')} holding {path.name} finds a moved copy)"
                     if recorded else "")
            raise DataError(f"tensor file {path} not found{moved}")
        path = path.resolve()
        unknown = ", ".join(map(repr, sorted(set(options) - {"num_classes"})))  # for classes empty on purpose
        if unknown:
            raise DataError(f"tensor file {name} has no option {unknown}; its option: num_classes")
        filled = dict(options)
        digest = sha256_file(path)
        if recorded and recorded.get("sha256") != digest:
            raise DataError(f"data file {path} changed since it was recorded (sha256 {str(recorded.get('sha256'))[:12]} "
                            f"then, {digest[:12]} now); restore it or train again")
        return (str(path), tensor_file_arrays(path, **filled), filled,
                {"source": {"path": str(path), "sha256": digest}})
    if kind == IMAGEFOLDER:
        root = data_root_of(data_root) or (Path(recorded["path"]) if recorded.get("path") else None)
        if root is None:
            raise DataError(f"imagefolder reads {param('data_root')}: a directory holding train/ and test/ ImageFolder trees")
        filled = _folder_options(options)
        source = directory_digest(root)
        if recorded and recorded.get("sha256") != source["sha256"]:
            raise DataError(f"image folder {root} changed since it was recorded ({recorded.get('files')} files then, "
                            f"{source['files']} now, different sha256); restore it or train again")
        return IMAGEFOLDER, imagefolder_arrays(root, **filled), filled, {"source": source}
    if kind == "torchvision":
        filled = _folder_options(options, extra=("kwargs",))
        arrays, source = torchvision_arrays(name, data_root, download, **filled)
        if recorded.get("sha256") and recorded.get("sha256") != source.get("sha256"):
            raise DataError(f"the {name} files under {source.get('path')} differ from those recorded (sha256); "
                            "restore them or train again")
        return name, arrays, filled, {"source": source}
    if kind == "entry_point":
        recorded = (stored or {}).get("entry_point")
        factory, info = plugins.checked_entry_point(ENTRY_POINT_GROUP, name, recorded, f"data set {name!r}")
        return name, user_arrays(factory, name, seed, data_root, options), options, {"entry_point": info}
    # code
    if stored is not None:
        ref, current = plugins.checked_code(stored["code"], "the stored data set")
        factory = plugins.load(ref)
    else:
        ref = plugins.parse(name)
        factory = plugins.load(ref)
        current = plugins.describe(ref)  # after the import: with the local modules it brought
    canonical = plugins.canonical(ref)
    return canonical, user_arrays(factory, canonical, seed, data_root, options), options, {"code": current}


def _kind_of(name: str, stored: dict | None) -> str:
    from landscape import plugins

    if stored is not None and ("code" in stored or "entry_point" in stored):
        return "code" if "code" in stored else "entry_point"  # a stored spec names its kind by its provenance
    if name == IMAGEFOLDER:
        return IMAGEFOLDER
    if name.lower().endswith(TENSOR_SUFFIXES):
        return "file"
    if stored is None and name in plugins.entry_points(ENTRY_POINT_GROUP):
        return "entry_point"
    if stored is None and plugins.is_code_ref(name):
        return "code"
    if torchvision_class(name) is not None:
        return "torchvision"
    if stored is not None:
        raise DataError(f"data spec {name!r} records a source landscape does not know")
    raise DataError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}, imagefolder, a torchvision "
                    "classification set by name (svhn, kmnist, ...), a .npz/.h5 tensor file, or module:factory / "
                    "file.py:factory")


def _folder_options(options: dict, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    allowed = {"size": None, "standardize": True, **{k: None for k in extra}}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise DataError(f"image data has no option {', '.join(map(repr, unknown))}; its options: {', '.join(allowed)}")
    filled = {**allowed, **options}
    size = filled["size"]
    if size is not None:
        size = [size, size] if isinstance(size, int) and not isinstance(size, bool) else size
        if not (isinstance(size, (list, tuple)) and len(size) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in size)):
            raise DataError(f"option size must be a positive integer or [height, width], got {filled['size']!r}")
        filled["size"] = [int(size[0]), int(size[1])]
    if not isinstance(filled["standardize"], bool):
        raise DataError(f"option standardize must be true or false, got {filled['standardize']!r}")
    if "kwargs" in filled and filled["kwargs"] is not None and not isinstance(filled["kwargs"], dict):
        raise DataError(f"option kwargs must be a JSON object of constructor arguments, got {filled['kwargs']!r}")
    return filled


def tensor_file_arrays(path: str | os.PathLike, *, num_classes: Any = None) -> _Arrays:
    """The four arrays ``x_train, y_train, x_test, y_test`` of an ``.npz`` or HDF5 file as tensors
    (:func:`_user_tensors`); the headers' claims are checked against the bytes held and the memory available
    before anything is read. Anything wrong with the file is one DataError line."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    try:
        if path.suffix.lower() == ".npz":
            _check_sizes(path, _npz_headers(path))
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in TENSOR_KEYS}
        else:
            import h5py

            with h5py.File(path, "r") as f:
                missing = [k for k in TENSOR_KEYS if k not in f]
                if missing:
                    raise DataError(f"{path} has no {', '.join(missing)} (it needs {', '.join(TENSOR_KEYS)}; "
                                    f"found {', '.join(f) or 'nothing'})")
                if not all(isinstance(f[k], h5py.Dataset) for k in TENSOR_KEYS):
                    raise DataError(f"{path}: {', '.join(TENSOR_KEYS)} must be HDF5 datasets (arrays), not groups")
                _check_sizes(path, {k: (tuple(f[k].shape), f[k].dtype) for k in TENSOR_KEYS})
                arrays = {k: np.asarray(f[k]) for k in TENSOR_KEYS}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, KeyError) as exc:
        raise DataError(f"cannot read tensor file {path}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    return _user_tensors(arrays, str(path), num_classes)


def _npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array's ``(shape, dtype)`` read from its ``.npy`` header inside the zip (``numpy.lib.format``), nothing
    loaded; a shape claiming more bytes than the member holds is refused here."""
    import zipfile

    if not zipfile.is_zipfile(path):
        what = "an empty file" if path.stat().st_size == 0 else "not a zip archive"
        raise DataError(f"{path} is not an .npz file ({what}): numpy.savez or savez_compressed writes one, with "
                        f"the arrays {', '.join(TENSOR_KEYS)}")
    headers = {}
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            missing = [k for k in TENSOR_KEYS if f"{k}.npy" not in names]
            if missing:
                found = ", ".join(n.removesuffix(".npy") for n in names) or "nothing"
                raise DataError(f"{path} has no {', '.join(missing)} (it needs {', '.join(TENSOR_KEYS)}; found {found})")
            for key in TENSOR_KEYS:
                info = z.getinfo(f"{key}.npy")
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = {(1, 0): np.lib.format.read_array_header_1_0,
                            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                    if read is None:
                        raise DataError(f"{path}: {key} is a .npy of format version {version[0]}.{version[1]} "
                                        f"(structured data); save plain arrays of numbers")
                    shape, _, dtype = read(f)
                    held = info.file_size - f.tell()
                if dtype.hasobject:
                    raise DataError(f"{path}: {key} holds Python objects; save an array of numbers")
                claimed = math.prod(shape) * dtype.itemsize
                if claimed > held:
                    raise DataError(f"{path}: the header of {key} claims shape {list(shape)} of {dtype} "
                                    f"({_bytes(claimed)}) but the file holds {_bytes(held)} of it: a damaged or "
                                    f"truncated file; write it again with numpy.savez")
                headers[key] = (tuple(shape), dtype)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise DataError(f"cannot read tensor file {path}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    return headers


def _check_sizes(path: Path, headers: dict[str, tuple[tuple[int, ...], Any]]) -> None:
    """Refuse, before anything is read, arrays that are not numbers or that need more memory than is available
    (the stored arrays plus their float32 / int64 tensors)."""
    need = 0
    for key, (shape, dtype) in headers.items():
        dtype = np.dtype(dtype)
        if dtype.kind not in "biuf":
            raise DataError(f"{path}: {key} holds {dtype} values; it must be an array of numbers")
        count = math.prod(shape)
        as_int64 = key.startswith("y") or (dtype.kind in "biu" and dtype != np.uint8)  # labels, token ids
        need += count * (dtype.itemsize + (8 if as_int64 else 4))
    available = _memory_available()
    if available is not None and need > available:
        shapes = ", ".join(f"{k} {list(s)} {np.dtype(d)}" for k, (s, d) in headers.items())
        raise DataError(f"{path}: loading it needs about {_bytes(need)} of memory ({shapes}) but {_bytes(available)} "
                        f"are available")


def _memory_available() -> int | None:
    """Bytes of memory available now (``MemAvailable`` of ``/proc/meminfo``, else the physical memory); None
    when the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _bytes(n: int) -> str:
    for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def _user_tensors(arrays: dict[str, Any], what: str, num_classes: Any = None) -> _Arrays:
    """Both splits as tensors: ``uint8`` inputs are image bytes and become float32 in [0, 1] (``x / 255``, recorded
    as the spec's ``inputs``), other floating inputs float32, other integer inputs int64 (token ids for an
    embedding layer); labels int64 class indices ``0..C-1`` with ``C`` = ``num_classes`` or the largest label + 1.

    Refused in one line naming ``what``: NaN or infinite inputs, negative labels, more than
    :data:`landscape.bounds.CLASSES_MAX` classes, and (without ``num_classes``) labels that leave a class below
    the largest without any example (a stray label 255 among 0..9 would make a 256-class model)."""
    out = {}
    for key in TENSOR_KEYS:
        value = arrays[key]
        try:
            tensor = torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor) else value)
        except (TypeError, ValueError, RuntimeError):
            raise DataError(f"{what}: {key} is a {type(value).__name__}, not an array of numbers") from None
        out[key] = tensor.detach().cpu()
    images = out["x_train"].dtype == torch.uint8 and out["x_test"].dtype == torch.uint8
    for split in ("train", "test"):
        x, y = out[f"x_{split}"], out[f"y_{split}"]
        if y.dim() != 1:
            raise DataError(f"{what}: y_{split} must be one label per example, got shape {list(y.shape)}")
        if x.dim() < 2:
            raise DataError(f"{what}: x_{split} must hold one row per example (N x ...), got shape {list(x.shape)}")
        if len(x) != len(y):
            raise DataError(f"{what}: x_{split} has {len(x)} examples but y_{split} has {len(y)}")
        if len(y) == 0:
            raise DataError(f"{what}: the {split} split is empty")
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise DataError(f"{what}: y_{split} must hold integer class labels, got {y.dtype}")
        if x.is_complex() or x.dtype == torch.bool:
            raise DataError(f"{what}: x_{split} must hold real numbers, got {x.dtype}")
        if images:
            x = x.to(torch.float32).div_(255.0)
        elif x.is_floating_point():
            x = x.to(torch.float32)
            _check_finite(x, f"x_{split}", what)
        else:
            x = x.to(torch.int64)
        out[f"x_{split}"], out[f"y_{split}"] = x, y.to(torch.int64)
    if out["x_train"].shape[1:] != out["x_test"].shape[1:]:
        raise DataError(f"{what}: train examples have shape {list(out['x_train'].shape[1:])} but test examples "
                        f"{list(out['x_test'].shape[1:])}")
    if out["x_train"].dtype != out["x_test"].dtype:
        raise DataError(f"{what}: x_train is {arrays['x_train'].dtype} but x_test is {arrays['x_test'].dtype}; "
                        f"store both splits with one dtype")
    classes = _class_count(torch.cat([out["y_train"], out["y_test"]]), what, num_classes)
    return _Arrays(out["x_train"], out["y_train"], out["x_test"], out["y_test"], classes,
                   inputs="uint8/255" if images else None)


def _check_finite(x: torch.Tensor, key: str, what: str) -> None:
    """NaN or infinite inputs: one line naming the split, how many and the first example (before any training
    could blame its learning rate)."""
    bad = ~torch.isfinite(x.reshape(len(x), -1)).all(dim=1)
    if bool(bad.any()):
        rows = torch.nonzero(bad).reshape(-1)
        values = int((~torch.isfinite(x[rows])).sum())
        raise DataError(f"{what}: {key} holds {values} NaN or infinite value(s) in {len(rows)} example(s) (the first "
                        f"is example {int(rows[0])}); replace them (numpy.nan_to_num) or drop those examples")


def _class_count(labels: torch.Tensor, what: str, num_classes: Any) -> int:
    """The class count: ``num_classes`` when given (at least the largest label + 1), else the largest label + 1,
    every class below it holding an example; bounded by :data:`landscape.bounds.CLASSES_MAX` before anything is
    allocated for it."""
    from landscape.bounds import CLASSES_MAX

    low, high = int(labels.min()), int(labels.max())
    if low < 0:
        raise DataError(f"{what}: labels must be class indices >= 0, got {low}")
    top = high + 1
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < top:
            raise DataError(f"{what}: num_classes must be an integer >= {top} (the largest label + 1), "
                            f"got {num_classes!r}")
        if num_classes > CLASSES_MAX:
            raise DataError(f"{what}: num_classes {num_classes} is more than {CLASSES_MAX:,} classes")
        return int(num_classes)
    if top > CLASSES_MAX:
        raise DataError(f"{what}: the largest label is {high:,}, more than {CLASSES_MAX:,} classes: a stray label? "
                        f"labels are class indices 0..C-1")
    present = torch.unique(labels)
    if len(present) < top:
        absent = sorted(set(range(top)) - set(present.tolist()))
        shown = ", ".join(map(str, absent[:5])) + (", ..." if len(absent) > 5 else "")
        hint = "1-based labels? subtract 1" if absent == [0] else "a stray label?"
        raise DataError(f"{what}: the labels leave {len(absent)} of {top} classes without any example ({shown}; "
                        f"largest label {high}): {hint} Relabel them to 0..C-1, or, if classes are empty on purpose, state "
                        f"the class count (a tensor file's {param('data_kwargs', json.dumps({'num_classes': top}))}, a factory's "
                        f"num_classes)")
    return top


def user_arrays(factory: Callable[..., Any], name: str, seed: int, data_root, options: dict) -> _Arrays:
    """Call a data factory as ``factory(**options)``, plus ``seed=`` and ``data_root=`` when its signature takes
    them, and take what it returns: the four tensors (a tuple, or a dict with those keys and optionally
    ``num_classes``) or the two splits as torch Datasets of ``(input, integer label)`` (docs/own-code.md)."""
    try:
        json.dumps(options)
    except (TypeError, ValueError):
        raise DataError(f"data set {name!r}: options must be JSON values, got {options!r}") from None
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    call = dict(options)
    for key, value in (("seed", seed), ("data_root", str(data_root) if data_root is not None else None)):
        if key in params or open_kwargs:
            call[key] = value
    try:
        returned = factory(**call)
    except DataError:
        raise
    except SystemExit as exc:  # never the command's own exit (sys.exit(0) would be a success that wrote nothing)
        raise DataError(f"data set {name!r}: the factory called sys.exit({exc.code!r}); it must return the data") \
            from None
    except Exception as exc:
        raise DataError(f"data set {name!r}: the factory failed: {type(exc).__name__}: "
                        f"{(str(exc).splitlines() or [''])[0]}") from None
    num_classes = None
    if isinstance(returned, dict):
        num_classes = returned.get("num_classes")
        if all(k in returned for k in TENSOR_KEYS):
            return _user_tensors(returned, f"data set {name!r}", num_classes)
        if "train" in returned and "test" in returned:
            returned = (returned["train"], returned["test"])
        else:
            raise DataError(f"data set {name!r}: the factory returned a dict without {', '.join(TENSOR_KEYS)} "
                            "(or train and test)")
    if isinstance(returned, (tuple, list)) and len(returned) == 2:
        train, test = (_materialise(split, f"data set {name!r}", which) for split, which
                       in zip(returned, ("train", "test"), strict=True))
        return _user_tensors({"x_train": train[0], "y_train": train[1], "x_test": test[0], "y_test": test[1]},
                             f"data set {name!r}", num_classes)
    if isinstance(returned, (tuple, list)) and len(returned) == 4:
        return _user_tensors(dict(zip(TENSOR_KEYS, returned, strict=True)), f"data set {name!r}", num_classes)
    raise DataError(f"data set {name!r}: the factory returned a {type(returned).__name__}; return (x_train, y_train, "
                    "x_test, y_test) tensors or (train, test) torch Datasets")


def _materialise(split: Any, what: str, which: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``torch.utils.data.Dataset`` of ``(tensor, int label)`` items as stacked ``(x, y)`` tensors."""
    if not hasattr(split, "__getitem__") or not hasattr(split, "__len__"):
        raise DataError(f"{what}: the {which} split is a {type(split).__name__}, not a torch Dataset")
    xs, ys = [], []
    for i in range(len(split)):
        item = split[i]
        ok = isinstance(item, (tuple, list)) and len(item) == 2
        if ok:
            x, y = item
            if isinstance(y, torch.Tensor) and y.numel() == 1 and not y.is_floating_point():
                y = int(y.item())
            elif isinstance(y, np.integer):
                y = int(y)
            ok = isinstance(x, (torch.Tensor, np.ndarray)) and isinstance(y, int) and not isinstance(y, bool)
        if not ok:
            shown = (f"({', '.join(type(v).__name__ for v in item)})" if isinstance(item, (tuple, list))
                     else f"a {type(item).__name__}")
            raise DataError(f"{what}: item {i} of the {which} Dataset is {shown}, not (tensor, int label)")
        xs.append(torch.as_tensor(x))
        ys.append(y)
    if not xs:
        raise DataError(f"{what}: the {which} Dataset is empty")
    try:
        return torch.stack(xs), torch.tensor(ys, dtype=torch.int64)
    except RuntimeError:
        raise DataError(f"{what}: the {which} Dataset's inputs have different shapes") from None


def directory_digest(root: str | os.PathLike) -> dict[str, Any]:
    """``{"path", "sha256", "files"}``: the sha256 of the manifest of every file below ``root`` (one line
    ``relative/path<TAB>sha256`` per file, sorted), so any added, removed, renamed or changed file shows."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data directory {root} not found")
    files = sorted(p for p in root.rglob("*") if p.is_file())
    lines = "".join(f"{p.relative_to(root).as_posix()}\t{sha256_file(p)}\n" for p in files)
    import hashlib

    return {"path": str(root.resolve()), "sha256": hashlib.sha256(lines.encode()).hexdigest(), "files": len(files)}


def _read_image(read: Callable[[], Any], what: str) -> Any:
    """``read()`` (PIL opening and decoding an image file), where a file that is not an image, a truncated or
    corrupt one, or one with more pixels than PIL's decompression-bomb limit is one DataError line naming ``what``
    (the file) instead of PIL's traceback."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return read()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise DataError(f"image {what} has more pixels than PIL's limit of {Image.MAX_IMAGE_PIXELS:,} (a "
                        f"decompression bomb?): shrink it or remove it") from None
    except Exception as exc:  # noqa: BLE001  (a decoder meeting a damaged file raises anything)
        from landscape.errors import one_line

        if isinstance(what, Path) and what.is_file() and what.stat().st_size == 0:
            reason = "an empty file"
        elif isinstance(exc, Image.UnidentifiedImageError):
            reason = "not an image PIL can read, or a damaged one"
        else:
            reason = one_line(exc)
        raise DataError(f"cannot read image {what}: {reason}; replace or remove it") from None


def _pil_tensor(image, size) -> torch.Tensor:
    from torchvision.transforms.functional import pil_to_tensor, resize

    if size is not None:
        image = resize(image, list(size))
    return pil_to_tensor(image)


def _stack_images(images: list[torch.Tensor], what: str) -> torch.Tensor:
    shapes = {tuple(i.shape) for i in images}
    if len(shapes) > 1:
        raise DataError(f"{what}: images have different sizes ({', '.join(map(str, sorted(shapes)[:3]))}...); "
                        f"give the option size, e.g. {param('data_kwargs', json.dumps({'size': 32}))}")
    return torch.stack(images).to(torch.float32).div_(255.0)


def _channel_standardize(x_train: torch.Tensor, x_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dims = [d for d in range(x_train.dim()) if d != 1]
    return _standardize(x_train, x_test, x_train.mean(dim=dims), x_train.std(dim=dims).clamp_min(1e-12))


def imagefolder_arrays(root: str | os.PathLike, *, size=None, standardize: bool = True) -> _Arrays:
    """torchvision ``ImageFolder`` trees ``root/train`` and ``root/test`` (one folder per class, the same class
    folders in both) as float32 ``N x C x H x W`` in [0, 1] (RGB), resized to ``size`` when given; with
    ``standardize`` each channel is shifted and scaled by its train mean and standard deviation."""
    from torchvision.datasets import ImageFolder

    root = Path(root)
    splits = []
    for which in ("train", "test"):
        folder = root / which
        if not folder.is_dir():
            raise DataError(f"imagefolder needs {folder} (one sub-folder per class); it is missing")
        try:
            tree = ImageFolder(str(folder))
        except (FileNotFoundError, OSError, RuntimeError) as exc:
            raise DataError(f"imagefolder {folder}: {str(exc).splitlines()[0]}") from None
        splits.append(tree)
    train, test = splits
    if train.classes != test.classes:
        raise DataError(f"imagefolder {root}: train/ has classes {train.classes[:5]} but test/ has {test.classes[:5]}")
    x = [_stack_images([_pil_tensor(_read_image(lambda t=tree, p=p: t.loader(p), Path(p)), size)
                        for p, _ in tree.samples], f"imagefolder {root}") for tree in splits]
    y = [torch.tensor(tree.targets, dtype=torch.int64) for tree in splits]
    if standardize:
        x = list(_channel_standardize(*x))
    return _Arrays(x[0], y[0], x[1], y[1], len(train.classes))


def torchvision_class(name: str):
    """The torchvision data-set class whose lower-case name is ``name`` (``svhn`` -> ``SVHN``), or None."""
    if not isinstance(name, str) or not name.replace("-", "").isalnum():
        return None
    import torchvision.datasets

    wanted = name.lower().replace("-", "")
    for attr in getattr(torchvision.datasets, "__all__", dir(torchvision.datasets)):
        cls = getattr(torchvision.datasets, attr, None)
        if isinstance(cls, type) and attr.lower() == wanted:
            return cls
    return None


def torchvision_arrays(name: str, data_root, download: bool, *, size=None, standardize: bool = True,
                       kwargs: dict | None = None) -> tuple[_Arrays, dict[str, Any]]:
    """A torchvision classification set by class name, read from ``data_root`` (fetched only with ``download``),
    as float32 images in [0, 1] (per-channel standardised on the train split when ``standardize``), and its
    source ``{"path", "sha256", "files", "class"}`` (the digest of the set's own folder)."""
    cls = torchvision_class(name)
    root = data_root_of(data_root)
    made = torchvision_splits(name, cls, root, download, kwargs)
    xs, ys = zip(*(_torchvision_tensors(ds, name, size) for ds in made), strict=True)
    x_train, x_test = xs
    if standardize:
        x_train, x_test = _channel_standardize(x_train, x_test)
    classes = getattr(made[0], "classes", None)
    num_classes = len(classes) if classes else int(max(int(ys[0].max()), int(ys[1].max())) + 1)
    own = next((Path(p) for p in (getattr(made[0], "raw_folder", None), getattr(made[0], "_base_folder", None))
                if p and Path(p).is_dir()), None)
    source = {**directory_digest(own), "class": cls.__name__} if own is not None else \
        {"path": str(Path(root).resolve()), "sha256": None, "class": cls.__name__}
    return _Arrays(x_train, ys[0], x_test, ys[1], num_classes), source


def _torchvision_tensors(ds, name: str, size) -> tuple[torch.Tensor, torch.Tensor]:
    data = getattr(ds, "data", None)
    targets = getattr(ds, "targets", getattr(ds, "labels", None))
    if size is None and data is not None and targets is not None and np.asarray(data).dtype == np.uint8:
        array = np.asarray(data)
        if array.ndim == 3 or (array.ndim == 4 and array.shape[-1] in (1, 3)):
            return _images_tensor(array), torch.as_tensor(np.asarray(targets), dtype=torch.int64)
        if array.ndim == 4 and array.shape[1] in (1, 3):  # SVHN, STL10: already N x C x H x W
            return torch.from_numpy(array).to(torch.float32).div_(255.0), \
                torch.as_tensor(np.asarray(targets), dtype=torch.int64)
    images, labels = [], []
    for i in range(len(ds)):
        image, label = _read_image(lambda i=i: ds[i], f"{i} of {name}")
        images.append(_pil_tensor(image, size))
        labels.append(int(label))
    return _stack_images(images, name), torch.tensor(labels, dtype=torch.int64)


def _jsonable(options: dict) -> dict:
    out = {}
    for key, value in options.items():
        if isinstance(value, (np.integer,)):
            value = int(value)
        elif isinstance(value, (np.floating,)):
            value = float(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out
