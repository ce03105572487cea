"""Dataset registry: a name in the config -> a loaded, feature-grouped DataBundle."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from growpipe.config import DataSpec
from growpipe.data.augment import Augment
from growpipe.data.batches import iterate_batches
from growpipe.data.bundle import (
    DataBundle,
    Split,
    apply_feature_groups,
    batch_at,
    hold_out,
    limit,
    normalise,
    one_class_problem,
)
from growpipe.data.sources import (
    load_cifar,
    load_digits_bundle,
    load_fashion_mnist,
    load_files,
    load_hf,
    load_imagefolder,
    load_newsgroups,
)
from growpipe.errors import DataError

REGISTRY: dict[str, tuple[Callable[[DataSpec], DataBundle], str]] = {
    "digits": (load_digits_bundle, "scikit-learn's bundled 8x8 digits, 1,347/450 (the embedded default)"),
    "fashion-mnist": (load_fashion_mnist, "Zalando Fashion-MNIST IDX .gz files, 60,000/10,000, 28x28"),
    "20newsgroups": (load_newsgroups, "20 Newsgroups by-date parquet (text, label), 11,293/7,528"),
    "cifar10": (partial(load_cifar, classes=10), "CIFAR-10 via torchvision (data.root or data.download)"),
    "cifar100": (partial(load_cifar, classes=100), "CIFAR-100 via torchvision (data.root or data.download)"),
}
PREFIXES: dict[str, tuple[Callable[[DataSpec], DataBundle], str]] = {
    "hf:": (load_hf, "Hugging Face dataset by hub name or local directory"),
    "parquet:": (load_files, "directory with train.parquet and test.parquet"),
    "csv:": (load_files, "directory with train.csv and test.csv"),
    "json:": (load_files, "directory with train.json(l) and test.json(l)"),
    "imagefolder:": (load_imagefolder, "directory with train/CLASS/* and test/CLASS/* images"),
}


def load_data(spec: DataSpec, seed: int = 0, keep_text: bool = False) -> DataBundle:
    """Load the dataset named in `spec`, subsample if asked, cut its feature groups, and set up training
    augmentation (seeded with the run's `seed`). `keep_text`: a text set's splits keep each row's raw text
    (Split.text, the rows the run trains and tests on); dropped otherwise."""
    if spec.name in REGISTRY:
        loader = REGISTRY[spec.name][0]
    else:
        loader = next(fn for prefix, (fn, _) in PREFIXES.items() if spec.name.startswith(prefix))
    bundle = loader(spec)
    if not keep_text:
        bundle.train.text = bundle.test.text = None
    bundle.source = bundle.source or (f"{spec.name} in {spec.root}" if spec.root else spec.name)
    bundle.train = limit(bundle.train, spec.limit_train)
    bundle.test = limit(bundle.test, spec.limit_test)
    if spec.val_fraction:
        bundle.train, bundle.val = hold_out(bundle.train, spec.val_fraction)
    hint = " (after data.limit_train and data.val_fraction)" if spec.limit_train or spec.val_fraction else ""
    if why := one_class_problem(bundle.train.y.numpy(), bundle.source, bundle.class_names, hint):
        raise DataError(why)
    bundle = normalise(bundle, spec, seed)  # statistics of the rows trained on (a sample of data.stats_rows)
    bundle = apply_feature_groups(bundle, spec.feature_groups)
    if spec.augment:
        if bundle.kind != "image":
            raise DataError(f"data.augment: {', '.join(spec.augment)} work on images but {bundle.name} is "
                            f"{bundle.kind} data; remove data.augment")  # fmt: skip
        bundle.train.augment = Augment(spec.augment, spec.crop_padding, seed, len(bundle.train))
    return bundle


__all__ = ["DataBundle", "Split", "batch_at", "iterate_batches", "load_data", "REGISTRY", "PREFIXES"]
