"""Dataset loaders: each returns a ``types.Source`` (uint8 NCHW images, int64 labels).

Hydra calls a loader with every key of its ``conf/dataset/<name>.yaml`` (besides ``_target_`` and
``family``) as a keyword argument; ``@options`` names the declaration of those keys (``loader_options``). Training images keep the original dataset order (torchvision order for CIFAR);
the ``folder`` loader yields class-sorted order unless ``order_labels`` restores the original one.
Every data problem (missing root, empty or malformed tree, undownloadable CIFAR, incomplete release,
corrupt image) raises ``DataError`` (a ValueError) with a one-line message naming the path;
``skip_corrupt=true`` drops undecodable images with a warning instead.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import warnings
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import loader_options
from .loader_options import options
from .types import UNKNOWN_LABEL, DataError, DatasetUnavailable, Source, one_line

#: docs/methods/setup.md §1.1: the reference code normalises CIFAR-10 with ImageNet statistics ...
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: ... and CIFAR-100 with its own
CIFAR100_MEAN = (0.507, 0.487, 0.441)
CIFAR100_STD = (0.267, 0.256, 0.276)
CIFAR_AUGMENT = {"crop": 32, "pad": 4, "flip": True}  # RandomCrop(32, padding=4) + HFlip
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_CACHE_VERSION = "folder-v1"
_CHUNK = 500  # images per decoding task


# ---------------------------------------------------------------------------------------------
# scikit-learn digits (offline default)


@options(loader_options.Digits)
def digits(name: str = "digits", test_size: float = 0.2, split_seed: int = 0) -> Source:
    """scikit-learn's 8x8 digits: a fixed stratified split (``split_seed``, not the run seed)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = np.floor(data.images * (255.0 / 16.0) + 0.5).astype(np.uint8)[:, None]  # 0..16 -> 0..255
    y = data.target.astype(np.int64)
    tr, te = train_test_split(np.arange(len(y)), test_size=test_size, stratify=y, random_state=split_seed)
    tr, te = np.sort(tr), np.sort(te)  # keep the original order within each split
    return _make_source(name, x[tr], y[tr], x[te], y[te], None, None, None, tuple(map(str, range(10))))


# ---------------------------------------------------------------------------------------------
# CIFAR via torchvision


@options(loader_options.Cifar)
def cifar10(
    name: str = "cifar10",
    root: str = "~/data",
    download: bool = True,
    mean=IMAGENET_MEAN,
    std=IMAGENET_STD,
    augment: dict | None = CIFAR_AUGMENT,
) -> Source:
    """CIFAR-10 (50k/10k) in torchvision order."""
    from torchvision.datasets import CIFAR10

    return _torchvision_cifar(CIFAR10, name, root, download, mean, std, augment)


@options(loader_options.Cifar)
def cifar100(
    name: str = "cifar100",
    root: str = "~/data",
    download: bool = True,
    mean=CIFAR100_MEAN,
    std=CIFAR100_STD,
    augment: dict | None = CIFAR_AUGMENT,
) -> Source:
    """CIFAR-100 (50k/10k, fine labels) in torchvision order."""
    from torchvision.datasets import CIFAR100

    return _torchvision_cifar(CIFAR100, name, root, download, mean, std, augment)


def _torchvision_cifar(cls, name, root, download, mean, std, augment) -> Source:
    root = _resolve(root)
    train, test = _open_torchvision(cls, root, download)
    return _make_source(
        name,
        torch.from_numpy(train.data).permute(0, 3, 1, 2).contiguous(),
        np.asarray(train.targets),
        torch.from_numpy(test.data).permute(0, 3, 1, 2).contiguous(),
        np.asarray(test.targets),
        mean,
        std,
        augment,
        tuple(train.classes),
    )


def _open_torchvision(cls, root: Path, download: bool):
    try:
        return cls(str(root), train=True, download=False), cls(str(root), train=False, download=False)
    except RuntimeError:
        if not download:
            raise DatasetUnavailable(
                f"{cls.__name__} not found or damaged under {root} (torchvision's file check failed) and download "
                f"is off: set dataset.root=<dir holding an intact copy> or dataset.download=true"
            ) from None
    try:
        return cls(str(root), train=True, download=True), cls(str(root), train=False, download=True)
    except Exception as err:  # network errors come in many types
        raise DatasetUnavailable(
            f"{cls.__name__} not found under {root} and the download failed ({type(err).__name__}: "
            f"{one_line(err)}): set dataset.root=<dir holding it> or download on a machine with internet"
        ) from err


# ---------------------------------------------------------------------------------------------
# image folder: root/{train,test}/<class>/*.{jpg,jpeg,png}


@options(loader_options.Folder)
def folder(
    name: str = "folder",
    root: str = "",
    cache_dir: str = "~/.cache/fedlnl",
    size: int | list[int] | None = None,
    mean=None,
    std=None,
    augment: dict | None = None,
    order_labels: str | None = None,
    order_labels_key: str = "clean_label",
    workers: int | None = None,
    skip_corrupt: bool = False,
) -> Source:
    """An image-folder tree, decoded once and cached as a uint8 ``.npz``.

    Classes are the ``train`` sub-folders sorted alphabetically (= label order); files within a
    class are sorted by numeric stem when every stem is an integer, else lexicographically. ``size``
    (int or [H, W]) resizes images to that size; without it, images of differing sizes are resized
    to the most common one. ``mean``/``std`` default to the training-set statistics.
    ``order_labels`` is a ``.pt``/``.npy``/``.npz`` file with the training labels in the original
    order (``order_labels_key`` for dicts): image i is then the r-th file of class y_i, r = number of
    earlier images labelled y_i, which restores the original training order. ``skip_corrupt``
    leaves out images that cannot be decoded (with a warning) instead of stopping.
    """
    root = _resolve(root)
    x_tr, y_tr, x_te, y_te, classes = _load_folder(root, _resolve(cache_dir), _size_hw(size), workers,
                                                   skip_corrupt)
    if order_labels is not None:
        x_tr, y_tr = _restore_order(x_tr, y_tr, _resolve(order_labels), order_labels_key)
    return _make_source(name, x_tr, y_tr, x_te, y_te, mean, std, augment, classes)


def _load_folder(root: Path, cache_dir: Path, size, workers, skip_corrupt: bool = False):
    """(x_train, y_train, x_test, y_test, classes), class-sorted, from the cache when it is fresh."""
    classes = _class_names(root)
    files = {split: _list_split(root / split, classes) for split in ("train", "test")}
    cache = cache_dir / f"{_CACHE_VERSION}-{_cache_key(root, files, size, skip_corrupt)}.npz"
    z = _read_cache(cache, ("x_train", "y_train", "x_test", "y_test", "classes"))
    if z is not None:
        return z["x_train"], z["y_train"], z["x_test"], z["y_test"], tuple(z["classes"].tolist())
    arrays = {}
    for split, (paths, labels) in files.items():
        x, kept = _decode_all([Path(e.path) for e in paths], size, workers, f"decoding {root.name}/{split}",
                              skip_corrupt)
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, labels[kept]
    _write_cache(cache, classes=np.array(classes), **arrays)
    return arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], classes


def _class_names(root: Path) -> tuple[str, ...]:
    train = root / "train"
    if not root.is_dir():
        raise DatasetUnavailable(f"dataset root {root} does not exist: set dataset.root=<dir with train/ and test/>")
    if not train.is_dir():
        raise DatasetUnavailable(f"no image folder at {train}: set dataset.root=<dir with train/ and test/>")
    classes = tuple(sorted(d.name for d in train.iterdir() if d.is_dir()))
    if not classes:
        raise DataError(f"{train} has no class sub-folders: expected train/<class>/<image> (one folder per class)")
    return classes


def _list_split(split_dir: Path, classes: tuple[str, ...]) -> tuple[list[os.DirEntry], np.ndarray]:
    """All image files of one split in (class, file) order, with their labels."""
    if not split_dir.is_dir():
        raise DatasetUnavailable(f"missing split folder {split_dir}: expected train/ and test/ under dataset.root")
    unknown = sorted(d.name for d in split_dir.iterdir() if d.is_dir() and d.name not in classes)
    if unknown:
        raise DataError(f"{split_dir} has classes missing from train/: {', '.join(unknown[:5])}")
    paths, labels = [], []
    for label, cls in enumerate(classes):
        found = _sorted_images(split_dir / cls)
        paths += found
        labels += [label] * len(found)
    if not paths:
        raise DataError(f"no {'/'.join(IMAGE_SUFFIXES)} images under {split_dir}")
    return paths, np.asarray(labels, dtype=np.int64)


def _sorted_images(class_dir: Path) -> list[os.DirEntry]:
    """The image files of one class folder, numerically sorted when every stem is a number. Directory
    entries, not Paths: every run lists and stats the 60,000 files of CIFAR for the cache key, and a
    scandir entry carries the file type from the listing (no second stat per file, as Path.is_file needs)."""
    if not class_dir.is_dir():
        return []
    with os.scandir(class_dir) as entries:
        files = [e for e in entries if os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES and e.is_file()]
    stems = [os.path.splitext(e.name)[0] for e in files]
    if all(s.isdigit() for s in stems):
        order = sorted(range(len(files)), key=lambda i: (int(stems[i]), files[i].name))
    else:
        order = sorted(range(len(files)), key=lambda i: files[i].name)
    return [files[i] for i in order]


def _cache_key(root: Path, files: dict, size, skip_corrupt: bool = False) -> str:
    """Digest of the root path, the file list with mtimes and sizes, and the resize/skip options."""
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{root.resolve()}|{size}{'|skip' if skip_corrupt else ''}".encode())
    for split, (paths, _) in files.items():
        h.update(split.encode())
        prefix = len(str(root)) + 1  # entry paths are str(root)/split/class/name
        for e in paths:
            st = e.stat()
            h.update(f"{e.path[prefix:]}|{st.st_mtime_ns}|{st.st_size}\n".encode())
    return h.hexdigest()


def _read_cache(path: Path, keys) -> dict | None:
    """The arrays of a decoded-image cache, or None when there is none. A damaged cache (truncated,
    overwritten, missing an array) is moved aside to ``<name>.corrupt`` with one warning, and the
    images are decoded again."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in keys}
    except Exception as err:  # noqa: BLE001  (zip, zlib, format and key errors all mean "damaged")
        aside = path.with_name(path.name + ".corrupt")
        k = 0
        while aside.exists():
            k += 1
            aside = path.with_name(f"{path.name}.corrupt.{k}")
        try:
            path.replace(aside)
            where = f"moved to {aside.name}"
        except OSError:
            where = "left in place"
        reason = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
        logging.getLogger("fedlnl").warning("the decoded-image cache %s is damaged (%s: %s): %s; decoding the "
                                            "images again", path, type(err).__name__, reason, where)
        return None


def _write_cache(path: Path, **arrays) -> None:
    """Write atomically (tmp file + rename); an unwritable cache only costs a warning."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except OSError as err:
        warnings.warn(f"could not write the image cache {path}: {err}", stacklevel=3)


def _say(message: str) -> None:
    """One progress line: through the ``fedlnl`` logger once logging is set up (a Hydra job, a sweep's
    checks), else on stderr (a single run's checks decode the data before Hydra sets logging up)."""
    logger = logging.getLogger("fedlnl")
    if logger.hasHandlers() and logger.isEnabledFor(logging.INFO):
        logger.info("%s", message)
    else:
        print(f"[fedlnl] {message}", file=sys.stderr, flush=True)


def _decode_all(paths: list[Path], size, workers: int | None, desc: str,
                skip_corrupt: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Decode (and maybe resize) every image to RGB; returns (uint8 [n', 3, H, W], the positions
    kept). An undecodable file stops with its path, or is left out when ``skip_corrupt``."""
    chunks = [paths[i : i + _CHUNK] for i in range(0, len(paths), _CHUNK)]
    workers = min(os.cpu_count() or 1, 8) if workers is None else workers
    images: list[np.ndarray] = []
    # a bar on a terminal only (disable=None); a redirected log gets a start and an end line instead
    quiet = not sys.stderr.isatty()
    if quiet:
        _say(f"{desc}: {len(paths)} images")
    with tqdm(total=len(paths), desc=desc, unit="img", leave=False, disable=None) as bar:
        if workers <= 1 or len(chunks) <= 1:
            results = map(_decode_chunk, chunks, [size] * len(chunks))
            images = _collect(results, bar)
        else:
            with Pool(workers) as pool:
                images = _collect(pool.imap(_decode_task, [(c, size) for c in chunks]), bar)
    if quiet:
        _say(f"{desc}: done")
    bad = [i for i, im in enumerate(images) if isinstance(im, str)]
    if bad and (not skip_corrupt or len(bad) == len(paths)):
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        hint = "" if skip_corrupt else ": replace or remove it, or set dataset.skip_corrupt=true"
        raise DataError(f"corrupt or truncated image {paths[bad[0]]}{more} ({images[bad[0]]}){hint}")
    if bad:
        warnings.warn(f"skipped {len(bad)} corrupt or truncated image(s), e.g. {paths[bad[0]]} ({images[bad[0]]})",
                      stacklevel=3)
    kept = np.array([i for i, im in enumerate(images) if not isinstance(im, str)], dtype=np.int64)
    return _stack_same_size([images[i] for i in kept], [paths[i] for i in kept]), kept


def _collect(results, bar) -> list[np.ndarray]:
    images = []
    for chunk in results:
        images += chunk
        bar.update(len(chunk))
    return images


def _decode_task(args) -> list[np.ndarray]:
    return _decode_chunk(*args)


def _decode_chunk(paths: list[Path], size) -> list[np.ndarray | str]:
    """Worker: PIL-decode a list of files to HWC uint8 RGB arrays (resized to ``size`` = (H, W)); a
    file that cannot be decoded yields the reason (a string) in its place, a missing file raises."""
    from PIL import Image

    out: list[np.ndarray | str] = []
    for p in paths:
        try:
            with Image.open(p) as im:
                im = im.convert("RGB")  # decodes: a truncated file fails here
                if size is not None and im.size != (size[1], size[0]):
                    im = im.resize((size[1], size[0]), Image.Resampling.BILINEAR)
                out.append(np.asarray(im, dtype=np.uint8))
        except FileNotFoundError:
            raise
        except Exception as err:  # PIL reports bad files as OSError, SyntaxError, ValueError, ...
            out.append(f"{type(err).__name__}: {one_line(err)}")
    return out


def _stack_same_size(images: list[np.ndarray], paths: list[Path]) -> np.ndarray:
    """Stack HWC images into NCHW; if sizes differ, re-decode the odd ones at the most common size."""
    shapes = [im.shape[:2] for im in images]
    sizes, counts = np.unique(np.array(shapes), axis=0, return_counts=True)
    if len(sizes) > 1:
        target = tuple(int(v) for v in sizes[np.argmax(counts)])
        warnings.warn(
            f"images under {paths[0].parents[2]} differ in size; resizing to the most common {target} "
            "(set dataset.size=[H,W] to choose)",
            stacklevel=3,
        )
        odd = [i for i, s in enumerate(shapes) if s != target]
        for i, im in zip(odd, _decode_chunk([paths[i] for i in odd], target)):
            images[i] = im  # decoded fine once already
    return np.ascontiguousarray(np.stack(images).transpose(0, 3, 1, 2))


def _restore_order(x: np.ndarray, y: np.ndarray, label_file: Path, key: str):
    """Reorder class-sorted (x, y) into the original order given by that order's labels."""
    if not label_file.exists():
        warnings.warn(f"{label_file} not found: training images stay in class-sorted order", stacklevel=3)
        return x, y
    y_orig = _read_labels(label_file, key)
    try:
        perm = original_order(y, y_orig)
    except ValueError as err:
        raise DataError(f"dataset.order_labels={label_file}: {err}") from None
    return x[perm], y[perm]


def original_order(y_sorted: np.ndarray, y_orig: np.ndarray) -> np.ndarray:
    """Positions in the class-sorted array of the images in original order.

    Image i of the original order is the r-th image of class y_i, r = #{j < i : y_j = y_i}.
    """
    y_sorted, y_orig = np.asarray(y_sorted), np.asarray(y_orig, dtype=np.int64)
    m = int(max(y_sorted.max(), y_orig.max())) + 1
    counts = np.bincount(y_sorted, minlength=m)
    if np.any(np.diff(y_sorted) < 0) or not np.array_equal(counts, np.bincount(y_orig, minlength=m)):
        raise ValueError("order_labels do not match the folder's per-class image counts")
    offset = np.concatenate([[0], np.cumsum(counts)[:-1]])
    by_class = np.argsort(y_orig, kind="stable")
    rank = np.empty(len(y_orig), dtype=np.int64)
    rank[by_class] = np.arange(len(y_orig)) - offset[y_orig[by_class]]
    return offset[y_orig] + rank


def _read_labels(path: Path, key: str) -> np.ndarray:
    try:
        if path.suffix == ".pt":
            obj = torch.load(path, map_location="cpu", weights_only=False)  # CIFAR-N: dict of numpy arrays
        else:
            obj = np.load(path)
    except FileNotFoundError:
        raise DataError(f"dataset.order_labels file {path} does not exist: set dataset.order_labels=<file>") from None
    except Exception as err:  # noqa: BLE001  (truncated or overwritten)
        raise DataError(f"dataset.order_labels file {path} is damaged ({type(err).__name__}): restore it from "
                        "its source (e.g. the CIFAR-N release) or set dataset.order_labels=<an intact copy>") from err
    if not isinstance(obj, (np.ndarray, torch.Tensor)):
        obj = obj[key]
    return np.asarray(obj, dtype=np.int64).reshape(-1)


# ---------------------------------------------------------------------------------------------
# synthetic Gaussian blobs


@options(loader_options.Synthetic)
def synthetic(
    name: str = "synthetic",
    n_train: int = 2000,
    n_test: int = 500,
    num_classes: int = 10,
    channels: int = 3,
    size: int = 32,
    noise: float = 0.1,
    seed: int = 0,
    augment: dict | None = None,
) -> Source:
    """Each class is a coloured Gaussian blob at its own place; samples jitter it and add pixel noise."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0.2, 0.8, (num_classes, 2)) * size
    colors = rng.uniform(0.3, 1.0, (num_classes, channels))
    x_tr, y_tr = _blobs(n_train, centers, colors, size, noise, rng)
    x_te, y_te = _blobs(n_test, centers, colors, size, noise, rng)
    classes = tuple(f"blob{c}" for c in range(num_classes))
    return _make_source(name, x_tr, y_tr, x_te, y_te, None, None, augment, classes)


def _blobs(n, centers, colors, size, noise, rng):
    m = len(centers)
    y = rng.permutation(np.arange(n) % m)  # balanced classes
    c = centers[y] + rng.normal(0.0, 0.05 * size, (n, 2))
    grid = np.arange(size) + 0.5
    dy = (grid[None, :] - c[:, :1]) ** 2  # [n, H]
    dx = (grid[None, :] - c[:, 1:]) ** 2  # [n, W]
    blob = np.exp(-(dy[:, :, None] + dx[:, None, :]) / (2 * (size / 6) ** 2))
    img = colors[y][:, :, None, None] * blob[:, None]
    img = img + rng.normal(0.0, noise, img.shape)
    return np.floor(np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8), y.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# shared helpers


def channel_stats(x: np.ndarray | torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 NCHW images, in [0, 1] pixel units (exact, via histograms)."""
    x = torch.as_tensor(x)
    levels = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for c in range(x.shape[1]):
        hist = torch.bincount(x[:, c].reshape(-1), minlength=256).numpy().astype(np.float64)
        mean = hist @ levels / hist.sum()
        means.append(float(mean))
        stds.append(float(np.sqrt(max(hist @ levels**2 / hist.sum() - mean**2, 0.0))))
    return tuple(means), tuple(stds)


def _make_source(name, x_tr, y_tr, x_te, y_te, mean, std, augment, classes) -> Source:
    x_tr, x_te = torch.as_tensor(x_tr, dtype=torch.uint8), torch.as_tensor(x_te, dtype=torch.uint8)
    if mean is None or std is None:
        stats = channel_stats(x_tr)
        mean = stats[0] if mean is None else mean
        std = stats[1] if std is None else std
    return Source(
        name=name,
        x_train=x_tr,
        y_train=torch.as_tensor(np.asarray(y_tr), dtype=torch.int64),
        x_test=x_te,
        y_test=torch.as_tensor(np.asarray(y_te), dtype=torch.int64),
        num_classes=len(classes),
        mean=tuple(float(v) for v in mean),
        std=tuple(float(v) for v in std),
        augment=dict(augment) if augment else None,
        classes=tuple(classes),
    )


def _resolve(path) -> Path:
    """Expand ``~`` and make relative paths relative to the launch directory (Hydra-aware)."""
    from hydra.utils import to_absolute_path

    return Path(to_absolute_path(os.path.expanduser(str(path))))


def _size_hw(size) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, int):
        return (size, size)
    h, w = size
    return (int(h), int(w))


# ---------------------------------------------------------------------------------------------
# Clothing1M (Xiao et al., CVPR 2015): real noisy labels, standard release layout

#: label order of the release (category_names_eng.txt), used when that file is absent
CLOTHING1M_CLASSES = ("T-Shirt", "Shirt", "Knitwear", "Chiffon", "Sweater", "Hoodie", "Windbreaker",
                      "Jacket", "Down Coat", "Suit", "Shawl", "Dress", "Vest", "Underwear")
CLOTHING1M_FILES = ("noisy_label_kv.txt", "clean_label_kv.txt", "noisy_train_key_list.txt",
                    "clean_test_key_list.txt")
#: docs/methods/setup.md §1.1: Resize(256, 256) -> RandomCrop 224 -> HFlip (the crop needs no padding)
CLOTHING1M_AUGMENT = {"crop": 224, "pad": 0, "flip": True}
_CLOTHING1M_CACHE_VERSION = "clothing1m-v2"  # v2: + kept positions (skip_corrupt)


@options(loader_options.Clothing1M)
def clothing1m(
    name: str = "clothing1m",
    root: str = "",
    cache_dir: str | None = "~/.cache/fedlnl",
    size: int | list[int] = 256,
    test_size: int | list[int] = 224,
    max_train: int | None = None,
    max_test: int | None = None,
    subsample_seed: int = 0,
    mean=IMAGENET_MEAN,
    std=IMAGENET_STD,
    augment: dict | None = CLOTHING1M_AUGMENT,
    workers: int | None = None,
    skip_corrupt: bool = False,
) -> Source:
    """Clothing1M from its release layout: ``root/images/...`` plus the four annotation files
    (in ``root`` or ``root/annotations``). Train = ``noisy_train_key_list.txt`` with the noisy
    labels of ``noisy_label_kv.txt``; test = ``clean_test_key_list.txt`` with clean labels.

    Training images are resized to ``size`` (docs/methods/setup.md §1.1: 256x256, then ``augment`` crops 224
    and flips), test images to ``test_size`` (224x224, no crop). ``max_train``/``max_test`` keep a
    uniformly random subset (drawn with ``subsample_seed``, list order kept): the full training set
    is about 196 GB as uint8 at 256x256. Decoded arrays are cached in ``cache_dir`` (None: no cache).
    ``y_train_clean`` holds the clean label where ``clean_label_kv.txt`` has one (about 37k of the
    1M training images) and ``UNKNOWN_LABEL`` (-1) elsewhere; the oracle scores only known ones.
    ``skip_corrupt`` leaves out images that cannot be decoded (with a warning) instead of stopping.
    """
    root = _resolve(root)
    ann = _clothing1m_annotations(root)
    noisy, clean = _read_kv(ann / "noisy_label_kv.txt"), _read_kv(ann / "clean_label_kv.txt")
    train_keys = _subsample(_read_keys(ann / "noisy_train_key_list.txt"), max_train, subsample_seed)
    test_keys = _subsample(_read_keys(ann / "clean_test_key_list.txt"), max_test, subsample_seed)
    y_train = _labels_of(train_keys, noisy, "noisy_label_kv.txt")
    y_test = _labels_of(test_keys, clean, "clean_label_kv.txt")
    y_clean = np.array([clean.get(k, UNKNOWN_LABEL) for k in train_keys], dtype=np.int64)
    sizes = (_size_hw(size), _size_hw(test_size))
    cache = _resolve(cache_dir) if cache_dir is not None else None
    x_train, x_test, kept_train, kept_test = _clothing1m_images(root, ann, train_keys, test_keys, sizes, cache,
                                                                workers, skip_corrupt)
    src = _make_source(name, x_train, y_train[kept_train], x_test, y_test[kept_test], mean, std, augment,
                       _clothing1m_classes(ann))
    return replace(src, y_train_clean=torch.from_numpy(y_clean[kept_train]))


def _clothing1m_annotations(root: Path) -> Path:
    """The folder holding the annotation files (root itself or root/annotations)."""
    for ann in (root, root / "annotations"):
        if all((ann / f).is_file() for f in CLOTHING1M_FILES) and (root / "images").is_dir():
            return ann
    raise DatasetUnavailable(
        f"Clothing1M not found under {root} (need images/ and {', '.join(CLOTHING1M_FILES)}): request "
        "the release from the authors (https://github.com/Cysu/noisy_label) and set dataset.root=<its dir>"
    )


def _read_kv(path: Path) -> dict[str, int]:
    """``key label`` lines -> {key: label}."""
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = int(parts[1])
    return out


def _read_keys(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def _subsample(keys: list[str], limit: int | None, seed: int) -> list[str]:
    """A uniformly random subset of ``limit`` keys in list order (all keys when limit is None)."""
    if limit is None or limit >= len(keys):
        return keys
    if limit < 1:
        raise ValueError(f"dataset.max_train/max_test must be >= 1 or null (got {limit})")
    keep = np.sort(np.random.default_rng(seed).choice(len(keys), size=int(limit), replace=False))
    return [keys[i] for i in keep]


def _labels_of(keys: list[str], labels: dict[str, int], source: str) -> np.ndarray:
    missing = [k for k in keys if k not in labels]
    if missing:
        raise DataError(f"{len(missing)} Clothing1M keys have no label in {source}, e.g. {missing[0]}")
    return np.array([labels[k] for k in keys], dtype=np.int64)


def _clothing1m_classes(ann: Path) -> tuple[str, ...]:
    names = ann / "category_names_eng.txt"
    if names.is_file():
        found = tuple(line.strip() for line in names.read_text().splitlines() if line.strip())
        if len(found) == len(CLOTHING1M_CLASSES):
            return found
    return CLOTHING1M_CLASSES


def _clothing1m_images(root: Path, ann: Path, train_keys, test_keys, sizes, cache_dir: Path | None, workers,
                       skip_corrupt: bool = False):
    """(x_train, x_test, kept train positions, kept test positions), uint8 NCHW, decoded once and
    cached; the cache key covers the annotation files (path, mtime, size), the chosen keys, both
    sizes and ``skip_corrupt`` (not a stat of every image)."""
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{root.resolve()}|{sizes}{'|skip' if skip_corrupt else ''}".encode())
    for f in CLOTHING1M_FILES:
        st = (ann / f).stat()
        h.update(f"{f}|{st.st_mtime_ns}|{st.st_size}\n".encode())
    for keys in (train_keys, test_keys):
        h.update("\n".join(keys).encode() + b"|")
    cache = cache_dir / f"{_CLOTHING1M_CACHE_VERSION}-{h.hexdigest()}.npz" if cache_dir is not None else None
    z = _read_cache(cache, ("x_train", "x_test", "kept_train", "kept_test")) if cache is not None else None
    if z is not None:
        return z["x_train"], z["x_test"], z["kept_train"], z["kept_test"]
    try:
        x_train, kept_train = _decode_all([root / k for k in train_keys], sizes[0], workers,
                                          "decoding clothing1m/train", skip_corrupt)
        x_test, kept_test = _decode_all([root / k for k in test_keys], sizes[1], workers,
                                        "decoding clothing1m/test", skip_corrupt)
    except FileNotFoundError as err:
        raise DatasetUnavailable(
            f"Clothing1M image {err.filename} is missing: the images/ tree under {root} is incomplete "
            "(extract every images/*.tar of the release there)"
        ) from err
    if cache is not None:
        _write_cache(cache, x_train=x_train, x_test=x_test, kept_train=kept_train, kept_test=kept_test)
    return x_train, x_test, kept_train, kept_test
