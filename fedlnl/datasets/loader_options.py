"""The options of each dataset loader, declared once: a frozen dataclass per loader whose fields are
the loader's keyword arguments (the keys of its ``conf/dataset/<name>.yaml`` besides ``_target_``),
each with its type, check and one-line doc (``fedlnl.conf.checks.key``). A loader in ``sources.py``
names its declaration with ``@options(...)``; the validator walks it and the docs' key tables list it.
Pure Python: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fedlnl.conf.checks import fail, flag, integer, is_int, is_number, key, number, rule


def options(declaration) -> Callable:
    """Decorator: ``declaration`` holds the loader's options (``loader.options``)."""
    def attach(fn: Callable) -> Callable:
        fn.options = declaration
        return fn
    return attach


def _check(ok: Callable[[object], bool], allowed: str):
    """A rule from a predicate on the value and the text of what it allows."""
    def check(key: str, value) -> None:
        if not ok(value):
            fail(key, value, allowed)
    return rule(check)


def _path(v) -> bool:
    return isinstance(v, str) and bool(v.strip()) and v != "???"


def _size(v) -> bool:
    return v is None or is_int(v, 1) or (isinstance(v, list) and len(v) == 2 and all(is_int(x, 1) for x in v))


def _stats(v) -> bool:
    return v is None or (isinstance(v, list) and len(v) >= 1 and all(is_number(x) for x in v))


def _augment(v) -> bool:
    if v is None:
        return True
    if not isinstance(v, dict) or set(v) - {"crop", "pad", "flip"}:
        return False
    return is_int(v.get("crop", 1), 1) and is_int(v.get("pad", 0), 0) and isinstance(v.get("flip", False), bool)


_NAME = _check(lambda v: isinstance(v, str) and bool(v), "a non-empty name")
_OPTIONAL_INT = _check(lambda v: v is None or is_int(v, 1), "an integer >= 1 or null")


@dataclass(frozen=True)
class DatasetNode:
    """The dataset node's keys besides the loader's (``_target_``: the loader)."""

    family: str = key("the column of the methods' per-dataset tables", _NAME)


@dataclass(frozen=True)
class Digits:
    """scikit-learn's 8x8 digits (``sources.digits``)."""

    name: str = key("the dataset's name in results", _NAME)
    test_size: float = key("share (or number) of images in the fixed test split", _check(
        lambda v: (is_number(v) and not isinstance(v, int) and 0 < v < 1) or is_int(v, 1),
        "a fraction in (0, 1) or a number of test images >= 1"))
    split_seed: int = key("seed of the fixed stratified split (not the run seed)", rule(integer, 0))


@dataclass(frozen=True)
class Images:
    """The keys of every loader of image files."""

    name: str = key("the dataset's name in results", _NAME)
    root: str = key("the dataset's folder", _check(_path, "a folder path (set dataset.root=DIR)"))
    mean: list[float] | None = key("per-channel normalisation mean (null: the training set's)", _check(
        _stats, "a list of per-channel numbers or null"))
    std: list[float] | None = key("per-channel normalisation std (null: the training set's)", _check(
        lambda v: _stats(v) and (v is None or all(x > 0 for x in v)), "a list of per-channel numbers > 0 or null"))
    augment: dict | None = key("training crop/flip: {crop, pad, flip} or null (none)", _check(
        _augment, "null or {crop: int >= 1, pad: int >= 0, flip: true|false}"))


@dataclass(frozen=True)
class Cifar(Images):
    """CIFAR-10 / CIFAR-100 through torchvision (``sources.cifar10``, ``sources.cifar100``)."""

    download: bool = key("download into root when absent", rule(flag))


@dataclass(frozen=True)
class Decoded(Images):
    """The keys of loaders that decode image files into a cache."""

    cache_dir: str | None = key("folder of the decoded-array cache (null: no cache)", _check(
        lambda v: v is None or _path(v), "a folder path or null"))
    size: int | list[int] | None = key("resize to this size (int or [H, W]; null: the most common)", _check(
        _size, "an integer >= 1, a pair [H, W] of integers >= 1, or null"))
    workers: int | None = key("decoding processes (null: the CPU count)", _check(
        lambda v: v is None or is_int(v, 0), "an integer >= 0 or null"))
    skip_corrupt: bool = key("leave out undecodable images (with a warning) instead of stopping", rule(flag))


@dataclass(frozen=True)
class Folder(Decoded):
    """An image-folder tree root/{train,test}/<class>/ (``sources.folder``)."""

    order_labels: str | None = key("file with the training labels in the original order (null: class-sorted)",
                                   _check(lambda v: v is None or _path(v), "a .pt/.npy/.npz file or null"))
    order_labels_key: str = key("the key of those labels in a dict file", _check(
        lambda v: isinstance(v, str) and bool(v), "a key name"))


@dataclass(frozen=True)
class Clothing1M(Decoded):
    """Clothing1M from its release layout (``sources.clothing1m``)."""

    test_size: int | list[int] = key("test images' size (int or [H, W]; no crop)", _check(
        lambda v: v is not None and _size(v), "an integer >= 1 or a pair [H, W]"))
    max_train: int | None = key("keep a random subset of this many training images (null: all)", _OPTIONAL_INT)
    max_test: int | None = key("keep a random subset of this many test images (null: all)", _OPTIONAL_INT)
    subsample_seed: int = key("seed of those subsets", rule(integer, 0))


@dataclass(frozen=True)
class Synthetic:
    """Coloured Gaussian blobs (``sources.synthetic``)."""

    name: str = key("the dataset's name in results", _NAME)
    n_train: int = key("training images", rule(integer, 1))
    n_test: int = key("test images", rule(integer, 1))
    num_classes: int = key("classes (blobs)", rule(integer, 1))
    channels: int = key("image channels", rule(integer, 1))
    size: int = key("image side in pixels", rule(integer, 1))
    noise: float = key("pixel noise std", rule(number, lambda v: v >= 0, "a pixel noise std >= 0"))
    seed: int = key("seed of the blobs (not the run seed)", rule(integer, 0))
    augment: dict | None = key("training crop/flip: {crop, pad, flip} or null (none)", _check(
        _augment, "null or {crop: int >= 1, pad: int >= 0, flip: true|false}"))
