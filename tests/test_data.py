"""lamina.utils.data: datasets, samplers, collation and DataLoader (with worker
processes), against hand-computed or NumPy-computed expectations; PyTorch, when
installed, for the semantics that must match it exactly."""

import collections
import gc
import subprocess
import sys
import time

import numpy as np
import pytest

import lamina as lm
from lamina.random import Generator, manual_seed
from lamina.utils.data import (
    BatchSampler,
    ChainDataset,
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    default_convert,
    get_worker_info,
    random_split,
)

Point = collections.namedtuple("Point", "x y")


def _data(n=10, features=3):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, features)).astype(np.float32)
    y = np.arange(n, dtype=np.int64) * 10
    return x, y


def _ids(loader):
    """The label batches of a loader over TensorDataset(x, y) as lists of item indices."""
    return [(b[1].numpy() // 10).tolist() for b in loader]


class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i * i


class Count(IterableDataset):
    """0 .. n-1; with workers, worker k gives k, k + num_workers, ..."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


# ---------------------------------------------------------------- datasets


def test_tensor_dataset_items_and_length():
    x, y = _data()
    ds = TensorDataset(lm.asarray(x), lm.asarray(y))
    assert len(ds) == 10
    xi, yi = ds[3]
    np.testing.assert_array_equal(xi.numpy(), x[3])
    assert yi.numpy() == 30


def test_tensor_dataset_rejects_mismatched_first_dimensions():
    with pytest.raises(ValueError, match=r"first dimensions must be equal, got sizes \[4, 5\]"):
        TensorDataset(lm.asarray(np.zeros((4, 2))), lm.asarray(np.zeros(5)))
    with pytest.raises(ValueError, match="at least one tensor"):
        TensorDataset()
    with pytest.raises(TypeError, match=r"tensors\[1\] must be a lamina tensor, got ndarray"):
        TensorDataset(lm.asarray(np.zeros(3)), np.zeros(3))
    with pytest.raises(ValueError, match=r"tensors\[0\] is 0-dimensional"):
        TensorDataset(lm.asarray(np.float64(1.0)))


def test_subset_concat_and_add():
    a, b = Squares(3), Squares(4)
    sub = Subset(b, [3, 1])
    assert [sub[0], sub[1]] == [9, 1] and len(sub) == 2
    assert sub.__getitems__([1, 0]) == [1, 9]
    cat = a + b
    assert isinstance(cat, ConcatDataset) and len(cat) == 7
    assert [cat[i] for i in range(7)] == [0, 1, 4, 0, 1, 4, 9]
    assert cat[-1] == 9 and cat[-7] == 0
    for bad in (7, -8):
        with pytest.raises(IndexError, match="out of range for 7 items"):
            cat[bad]
    with pytest.raises(ValueError, match="datasets is empty"):
        ConcatDataset([])
    with pytest.raises(TypeError, match=r"datasets\[1\] is an IterableDataset"):
        ConcatDataset([a, Count(2)])


def test_chain_dataset_and_iterable_add():
    chained = Count(2) + Count(3)
    assert isinstance(chained, ChainDataset)
    assert list(chained) == [0, 1, 0, 1, 2] and len(chained) == 5
    with pytest.raises(TypeError, match=r"datasets\[0\] must be an IterableDataset"):
        ChainDataset([Squares(2)])


def test_base_classes_ask_for_their_methods():
    with pytest.raises(NotImplementedError, match="must define __getitem__"):
        Dataset()[0]
    with pytest.raises(NotImplementedError, match="must define __iter__"):
        iter(IterableDataset())
    with pytest.raises(NotImplementedError, match="must define __iter__"):
        iter(Sampler())
    # PyTorch code subscripts the generic bases in annotations and class statements
    assert Dataset[int] is not None and Sampler[int] is not None


def test_random_split_sizes_disjoint_and_deterministic():
    ds = Squares(10)
    parts = random_split(ds, [3, 7], generator=Generator().manual_seed(0))
    assert [len(p) for p in parts] == [3, 7]
    indices = parts[0].indices + parts[1].indices
    assert sorted(indices) == list(range(10))
    again = random_split(ds, [3, 7], generator=Generator().manual_seed(0))
    assert [p.indices for p in again] == [p.indices for p in parts]
    manual_seed(5)
    first = [p.indices for p in random_split(ds, [5, 5])]
    manual_seed(5)
    assert [p.indices for p in random_split(ds, [5, 5])] == first
    assert parts[1][0] == parts[1].indices[0] ** 2


@pytest.mark.parametrize(
    "n, fractions, expected",
    [
        (10, [0.3, 0.3, 0.4], [3, 3, 4]),
        (11, [0.5, 0.5], [6, 5]),  # 5 + 5, the remainder to the first split
        (7, [0.33, 0.33, 0.34], [3, 2, 2]),  # floors 2, 2, 2; one left over
        (5, [0.25, 0.25, 0.25, 0.25], [2, 1, 1, 1]),
    ],
)
def test_random_split_fractions(n, fractions, expected):
    parts = random_split(Squares(n), fractions, generator=Generator().manual_seed(1))
    assert [len(p) for p in parts] == expected
    assert sorted(i for p in parts for i in p.indices) == list(range(n))


def test_random_split_fraction_lengths_match_pytorch():
    torch = pytest.importorskip("torch")
    from torch.utils.data import random_split as torch_split

    for n, fractions in [(10, [0.3, 0.3, 0.4]), (11, [0.5, 0.5]), (7, [0.33, 0.33, 0.34])]:
        ours = [len(p) for p in random_split(Squares(n), fractions)]
        theirs = [len(p) for p in torch_split(range(n), fractions, torch.Generator())]
        assert ours == theirs


def test_random_split_errors():
    ds = Squares(10)
    with pytest.raises(ValueError, match="lengths sum to 9, but the dataset has 10 items"):
        random_split(ds, [4, 5])
    with pytest.raises(ValueError, match=r"lengths\[1\] must be non-negative, got -1"):
        random_split(ds, [11, -1])
    with pytest.raises(ValueError, match=r"fraction lengths\[0\]=-0.5 is not between 0 and 1"):
        random_split(ds, [-0.5, 1.5])
    with pytest.raises(ValueError, match="must be ints, or fractions that sum to 1"):
        random_split(ds, [0.5, 9.5])
    with pytest.raises(TypeError, match=r"lengths\[0\] must be a number"):
        random_split(ds, ["5", 5])
    with pytest.raises(TypeError, match="lengths must be a non-empty list"):
        random_split(ds, 10)
    with pytest.raises(TypeError, match="generator must be a lamina.random.Generator"):
        random_split(ds, [5, 5], generator=np.random.default_rng(0))
    with pytest.warns(UserWarning, match="split 1 is empty"):
        random_split(Squares(1), [0.5, 0.5])


# ---------------------------------------------------------------- samplers


def test_sequential_and_batch_samplers():
    assert list(SequentialSampler(range(5))) == [0, 1, 2, 3, 4]
    assert list(BatchSampler(range(10), 3, drop_last=False)) == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
        [9],
    ]
    assert list(BatchSampler(range(10), 3, drop_last=True)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert len(BatchSampler(range(10), 3, False)) == 4
    assert len(BatchSampler(range(10), 3, True)) == 3
    assert len(BatchSampler(range(9), 3, False)) == 3
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            BatchSampler(range(3), bad, False)
    with pytest.raises(TypeError, match="drop_last must be a bool, got 1"):
        BatchSampler(range(3), 2, 1)


def test_random_sampler_permutation_and_determinism():
    out = list(RandomSampler(range(50), generator=Generator().manual_seed(3)))
    assert sorted(out) == list(range(50)) and out != list(range(50))
    assert out == list(RandomSampler(range(50), generator=Generator().manual_seed(3)))
    manual_seed(3)
    a = list(RandomSampler(range(50)))
    manual_seed(3)
    assert list(RandomSampler(range(50))) == a
    # each pass continues the generator: a new order
    sampler = RandomSampler(range(50), generator=Generator().manual_seed(3))
    assert list(sampler) != list(sampler)


def test_random_sampler_num_samples_and_replacement():
    out = list(RandomSampler(range(10), num_samples=25, generator=Generator().manual_seed(0)))
    assert len(out) == 25
    # two whole permutations, then five distinct indices
    assert sorted(out[:10]) == sorted(out[10:20]) == list(range(10))
    assert len(set(out[20:])) == 5
    g = Generator().manual_seed(0)
    drawn = list(RandomSampler(range(4), replacement=True, num_samples=400, generator=g))
    assert len(drawn) == 400 and set(drawn) == {0, 1, 2, 3}
    assert len(RandomSampler(range(7))) == 7
    with pytest.raises(ValueError, match="num_samples must be a positive int or None, got 0"):
        RandomSampler(range(3), num_samples=0)
    with pytest.raises(TypeError, match="replacement must be a bool"):
        RandomSampler(range(3), replacement="yes")
    with pytest.raises(ValueError, match="data_source is empty"):
        RandomSampler([])


def test_subset_random_sampler():
    indices = [7, 3, 11, 5]
    out = list(SubsetRandomSampler(indices, generator=Generator().manual_seed(2)))
    assert sorted(out) == sorted(indices) and len(SubsetRandomSampler(indices)) == 4
    assert out == list(SubsetRandomSampler(indices, generator=Generator().manual_seed(2)))


def test_weighted_random_sampler():
    weights = [1.0, 0.0, 3.0]
    out = list(WeightedRandomSampler(weights, 20000, generator=Generator().manual_seed(0)))
    counts = np.bincount(out, minlength=3)
    assert counts[1] == 0
    assert abs(counts[2] / 20000 - 0.75) < 0.02  # the weights need not sum to 1
    distinct = list(
        WeightedRandomSampler(
            lm.asarray(np.array([1.0, 2, 3, 4])), 4, replacement=False, generator=Generator()
        )
    )
    assert sorted(distinct) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="num_samples must be a positive int, got 0"):
        WeightedRandomSampler(weights, 0)
    with pytest.raises(ValueError, match=r"one-dimensional, got shape \(2, 2\)"):
        WeightedRandomSampler([[1, 2], [3, 4]], 2)
    with pytest.raises(ValueError, match="finite and non-negative"):
        WeightedRandomSampler([1.0, -1.0], 2)
    with pytest.raises(ValueError, match="must not all be zero"):
        WeightedRandomSampler([0.0, 0.0], 2)
    with pytest.raises(ValueError, match="num_samples=3 indices without replacement from 2"):
        WeightedRandomSampler(weights, 3, replacement=False)


# ---------------------------------------------------------------- collation


def test_default_collate_types():
    ints = default_collate([1, 2, 3])
    assert ints.dtype == lm.int64 and ints.tolist() == [1, 2, 3]
    floats = default_collate([1.5, 2.0])
    assert floats.dtype == lm.float64 and floats.tolist() == [1.5, 2.0]
    assert default_collate([True, False]).dtype == lm.bool
    scalars = default_collate([np.float32(1), np.float32(2)])
    assert scalars.dtype == lm.float32
    arrays = [np.arange(6, dtype=np.int32).reshape(2, 3) + k for k in range(4)]
    stacked = default_collate(arrays)
    assert stacked.dtype == lm.int32
    np.testing.assert_array_equal(stacked.numpy(), np.stack(arrays))
    tensors = [lm.asarray(a.astype(np.float32)) for a in arrays]
    np.testing.assert_array_equal(default_collate(tensors).numpy(), np.stack(arrays))
    assert default_collate(["a", "b"]) == ["a", "b"]


def test_default_collate_containers():
    batch = [
        {"x": np.array([1.0, 2.0]), "label": 0, "name": "a", "p": Point(1, 2.0)},
        {"x": np.array([3.0, 4.0]), "label": 1, "name": "b", "p": Point(3, 4.0)},
    ]
    out = default_collate(batch)
    assert set(out) == {"x", "label", "name", "p"}
    np.testing.assert_array_equal(out["x"].numpy(), [[1.0, 2.0], [3.0, 4.0]])
    assert out["label"].tolist() == [0, 1] and out["name"] == ["a", "b"]
    assert isinstance(out["p"], Point) and out["p"].x.dtype == lm.int64
    assert out["p"].y.dtype == lm.float64
    pairs = default_collate([(1, "a"), (2, "b")])
    assert isinstance(pairs, list)  # tuples come back as lists, as PyTorch's
    assert pairs[0].tolist() == [1, 2] and list(pairs[1]) == ["a", "b"]
    nested = default_collate([[1, [2.0]], [3, [4.0]]])
    assert nested[0].tolist() == [1, 3] and nested[1][0].tolist() == [2.0, 4.0]
    ordered = default_collate([collections.OrderedDict(b=1, a=2)] * 2)
    assert isinstance(ordered, collections.OrderedDict) and list(ordered) == ["b", "a"]


def test_default_collate_errors():
    with pytest.raises(RuntimeError, match=r"same length, got lengths \[2, 1\]"):
        default_collate([[1, 2], [3]])
    with pytest.raises(TypeError, match="found object"):
        default_collate([object(), object()])
    with pytest.raises(TypeError, match="a NumPy array of dtype <U1"):
        default_collate([np.array(["a"]), np.array(["b"])])


def test_default_convert():
    out = default_convert((np.zeros(2, dtype=np.float32), 1, "a", [np.int64(3)]))
    assert isinstance(out, list)
    assert out[0].dtype == lm.float32 and out[1] == 1 and out[2] == "a"
    assert out[3][0].dtype == lm.int64 and out[3][0].tolist() == 3
    assert isinstance(default_convert({"p": Point(np.ones(1), 2)})["p"].x, lm.Tensor)
    text = np.array(["a"])
    assert default_convert(text) is text


def test_default_collate_matches_pytorch():
    pytest.importorskip("torch")
    from torch.utils.data import default_collate as torch_collate

    def shape(obj):
        """Structure and dtypes, in names both libraries share."""
        if hasattr(obj, "dtype") and hasattr(obj, "shape"):
            return ("tensor", str(obj.dtype).split(".")[-1], tuple(obj.shape))
        if isinstance(obj, dict):
            return {k: shape(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return (type(obj).__name__, [shape(v) for v in obj])
        return obj

    batches = [
        [1, 2],
        [1.0, 2.0],
        [True, False],
        [np.float32(1), np.float32(2)],
        [np.zeros((2, 3), dtype=np.int16)] * 3,
        [(1, 2.0, "s")] * 2,
        [{"a": [1, 2], "b": Point(1.0, np.zeros(2))}] * 2,
        ["x", "y"],
    ]
    for batch in batches:
        assert shape(default_collate(batch)) == shape(torch_collate(batch)), batch


# ---------------------------------------------------------------- DataLoader


def test_batches_match_numpy_slices():
    x, y = _data(10)
    loader = DataLoader(TensorDataset(lm.asarray(x), lm.asarray(y)), batch_size=4)
    batches = list(loader)
    assert len(batches) == len(loader) == 3
    for k, (xb, yb) in enumerate(batches):
        np.testing.assert_array_equal(xb.numpy(), x[4 * k : 4 * k + 4])
        np.testing.assert_array_equal(yb.numpy(), y[4 * k : 4 * k + 4])
        assert xb.dtype == lm.float32 and yb.dtype == lm.int64


def test_shuffle_is_a_deterministic_permutation():
    x, y = _data(23)
    ds = TensorDataset(lm.asarray(x), lm.asarray(y))
    runs = [
        _ids(DataLoader(ds, batch_size=5, shuffle=True, generator=Generator().manual_seed(0)))
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    order = [i for batch in runs[0] for i in batch]
    assert sorted(order) == list(range(23)) and order != list(range(23))
    assert [len(b) for b in runs[0]] == [5, 5, 5, 5, 3]
    # rows and labels stay together
    for xb, yb in DataLoader(ds, batch_size=5, shuffle=True):
        np.testing.assert_array_equal(xb.numpy(), x[yb.numpy() // 10])
    seeded = []
    for _ in range(2):
        manual_seed(0)
        loader = DataLoader(ds, batch_size=5, shuffle=True)
        seeded.append((_ids(loader), _ids(loader)))
    assert seeded[0] == seeded[1]
    assert seeded[0][0] != seeded[0][1]  # a new order each pass


def test_drop_last_and_len():
    ds = Squares(10)
    assert [b.tolist() for b in DataLoader(ds, batch_size=4, drop_last=True)] == [
        [0, 1, 4, 9],
        [16, 25, 36, 49],
    ]
    cases = [(4, False, 3), (4, True, 2), (5, True, 2), (5, False, 2), (11, True, 0)]
    for batch_size, drop_last, expected in cases:
        loader = DataLoader(ds, batch_size=batch_size, drop_last=drop_last)
        assert len(loader) == expected == len(list(loader))
    assert len(DataLoader(ds, batch_size=None)) == 10
    iterable = DataLoader(Count(10), batch_size=4)
    assert len(iterable) == 3 == len(list(iterable))
    assert len(DataLoader(Count(10), batch_size=4, drop_last=True)) == 2


def test_len_matches_pytorch():
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader as TorchLoader

    for n, batch_size, drop_last in [(10, 4, False), (10, 4, True), (9, 3, True), (1, 5, False)]:
        ours = DataLoader(Squares(n), batch_size=batch_size, drop_last=drop_last)
        theirs = TorchLoader(Squares(n), batch_size=batch_size, drop_last=drop_last)
        assert len(ours) == len(theirs)
        assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]


def test_unbatched_samplers_and_custom_collate():
    ds = Squares(5)
    assert list(DataLoader(ds, batch_size=None)) == [0, 1, 4, 9, 16]  # default_convert
    np_items = list(DataLoader([np.float32(1.5)], batch_size=None))
    assert np_items[0].dtype == lm.float32
    loader = DataLoader(ds, batch_size=2, sampler=[4, 0, 2])
    assert [b.tolist() for b in loader] == [[16, 0], [4]]
    loader = DataLoader(ds, batch_sampler=[[1, 2], [0], [4, 3]])
    assert [b.tolist() for b in loader] == [[1, 4], [0], [16, 9]]
    assert loader.batch_size is None and len(loader) == 3
    loader = DataLoader(ds, batch_size=3, collate_fn=lambda items: sum(items))
    assert list(loader) == [5, 25]
    loader = DataLoader(Count(5), batch_size=2, drop_last=True)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert list(DataLoader(Count(3), batch_size=None)) == [0, 1, 2]
    assert get_worker_info() is None


def test_loader_arguments_are_checked():
    ds = Squares(4)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="batch_size must be a positive int or None"):
            DataLoader(ds, batch_size=bad)
    with pytest.raises(ValueError, match="num_workers must be a non-negative int"):
        DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="timeout must be a non-negative number"):
        DataLoader(ds, timeout=-1)
    with pytest.raises(TypeError, match="shuffle must be a bool, got 'yes'"):
        DataLoader(ds, shuffle="yes")
    with pytest.raises(TypeError, match="drop_last must be a bool"):
        DataLoader(ds, drop_last=None)
    with pytest.raises(TypeError, match="collate_fn must be callable or None"):
        DataLoader(ds, collate_fn=3)
    with pytest.raises(TypeError, match="generator must be a lamina.random.Generator"):
        DataLoader(ds, generator=np.random.default_rng(0))
    with pytest.raises(TypeError, match="dataset must be a map-style dataset"):
        DataLoader(iter([1, 2]))
    with pytest.raises(TypeError, match="sampler must be an iterable of indices"):
        DataLoader(ds, sampler=3)
    with pytest.raises(ValueError, match="shuffle=True cannot be used with an IterableDataset"):
        DataLoader(Count(3), shuffle=True)
    with pytest.raises(ValueError, match="sampler cannot be used with an IterableDataset"):
        DataLoader(Count(3), sampler=[0, 1])
    with pytest.raises(ValueError, match="batch_sampler cannot be used with an IterableDataset"):
        DataLoader(Count(3), batch_sampler=[[0]])
    with pytest.raises(ValueError, match="sampler and shuffle=True exclude each other"):
        DataLoader(ds, sampler=[0], shuffle=True)
    for kwargs in ({"batch_size": 2}, {"shuffle": True}, {"sampler": [0]}, {"drop_last": True}):
        with pytest.raises(ValueError, match="batch_sampler excludes batch_size, shuffle"):
            DataLoader(ds, batch_sampler=[[0]], **kwargs)
    with pytest.raises(ValueError, match="drop_last=True needs batches"):
        DataLoader(ds, batch_size=None, drop_last=True)
    with pytest.raises(ValueError, match="prefetch_factor needs worker processes"):
        DataLoader(ds, prefetch_factor=2)
    with pytest.raises(ValueError, match="prefetch_factor must be a positive int"):
        DataLoader(ds, num_workers=1, prefetch_factor=0)
    with pytest.raises(ValueError, match="persistent_workers needs num_workers > 0"):
        DataLoader(ds, persistent_workers=True)
    with pytest.raises(ValueError, match="multiprocessing_context needs worker processes"):
        DataLoader(ds, multiprocessing_context="fork")
    with pytest.raises(ValueError, match="multiprocessing_context must be one of"):
        DataLoader(ds, num_workers=1, multiprocessing_context="threads")
    loader = DataLoader(ds, batch_size=2)
    with pytest.raises(ValueError, match="batch_size cannot be set after the DataLoader is made"):
        loader.batch_size = 3
    loader.num_workers = 0  # the other attributes may change, as in PyTorch


# ---------------------------------------------------------------- worker processes


class WorkerProbe(Dataset):
    """Item i: (i, the worker's id, its seed, lm.rand from its default stream, a
    float32 tensor, a dict)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        assert info.dataset is self and info.num_workers == 2
        return (
            i,
            info.id,
            info.seed,
            lm.rand(1, dtype=lm.float64),
            lm.asarray(np.full(2, i, dtype=np.float32)),
            {"i": i},
        )


def test_workers_give_the_single_process_batches_in_order():
    x, y = _data(37)
    ds = TensorDataset(lm.asarray(x), lm.asarray(y))

    def run(workers):
        loader = DataLoader(
            ds,
            batch_size=4,
            shuffle=True,
            num_workers=workers,
            generator=Generator().manual_seed(7),
        )
        return [(xb.numpy(), yb.numpy()) for xb, yb in loader]

    single, multi = run(0), run(2)
    assert len(single) == len(multi) == 10
    for (xs, ys), (xm, ym) in zip(single, multi):
        np.testing.assert_array_equal(xs, xm)
        np.testing.assert_array_equal(ys, ym)
    assert sorted(np.concatenate([b[1] for b in multi]).tolist()) == y.tolist()


def test_worker_seeds_info_and_determinism():
    def run():
        manual_seed(11)
        return list(DataLoader(WorkerProbe(), batch_size=2, num_workers=2, prefetch_factor=1))

    first, second = run(), run()
    ids = [b[1].tolist() for b in first]
    assert ids == [[0, 0], [1, 1], [0, 0], [1, 1]]  # batches go to the workers in turn
    seeds = {b[1].tolist()[0]: b[2].tolist()[0] for b in first}
    assert seeds[1] == seeds[0] + 1  # base_seed + worker id
    rand = np.concatenate([b[3].numpy().ravel() for b in first])
    np.testing.assert_array_equal(rand, np.concatenate([b[3].numpy().ravel() for b in second]))
    by_worker = {0: rand[[0, 1, 4, 5]], 1: rand[[2, 3, 6, 7]]}
    assert not np.array_equal(by_worker[0], by_worker[1])
    for worker_id, draws in by_worker.items():
        # each worker's default stream restarted from its seed
        manual_seed(seeds[worker_id])
        expected = [lm.rand(1, dtype=lm.float64).numpy()[0] for _ in range(4)]
        np.testing.assert_array_equal(draws, expected)
    assert [b[0].tolist() for b in first] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert first[1][4].dtype == lm.float32 and first[1][4].numpy().tolist() == [[2, 2], [3, 3]]
    assert first[1][5]["i"].tolist() == [2, 3]
    # worker_init_fn runs in each worker first, with its id
    calls = DataLoader(
        Squares(4),
        batch_size=None,
        num_workers=2,
        worker_init_fn=lambda wid: np.random.seed(wid),
        collate_fn=lambda item: (item, np.random.randint(1000)),
    )
    draws = list(calls)
    assert draws[0][1] == np.random.RandomState(0).randint(1000)
    assert draws[1][1] == np.random.RandomState(1).randint(1000)


class Faulty(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            raise ValueError(f"item {i} is corrupt")
        return i


def test_worker_exception_is_raised_with_worker_id_and_traceback():
    loader = DataLoader(Faulty(), batch_size=1, num_workers=2)
    got = []
    with pytest.raises(ValueError, match="in DataLoader worker process 1") as err:
        for batch in loader:
            got.append(batch.tolist())
    assert got == [[0], [1], [2]]
    text = str(err.value)
    assert "Traceback (most recent call last)" in text
    assert "item 3 is corrupt" in text and "__getitem__" in text

    def init(worker_id):
        raise OSError("no such shard")

    with pytest.raises(OSError, match="(?s)worker process 0.*no such shard"):
        next(iter(DataLoader(Squares(2), num_workers=1, worker_init_fn=init)))


def test_iterable_dataset_with_workers_and_persistent_workers():
    loader = DataLoader(Count(7), batch_size=2, num_workers=2)
    # worker 0 gives 0 2 4 6, worker 1 gives 1 3 5; their batches alternate
    assert [b.tolist() for b in loader] == [[0, 2], [1, 3], [4, 6], [5]]
    persistent = DataLoader(Count(6), batch_size=2, num_workers=2, persistent_workers=True)
    epochs = [[b.tolist() for b in persistent] for _ in range(2)]
    assert epochs[0] == epochs[1] == [[0, 2], [1, 3], [4], [5]]
    workers = persistent._iterator._pool.processes
    assert all(w.is_alive() for w in workers)
    del persistent
    gc.collect()
    assert not any(w.is_alive() for w in workers)


def test_workers_exit_when_iteration_ends_or_is_dropped():
    loader = DataLoader(Squares(6), batch_size=2, num_workers=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    workers = it._pool.processes
    assert all(w.is_alive() for w in workers)
    del it
    gc.collect()
    assert not any(w.is_alive() for w in workers)
    it = iter(loader)
    assert len(list(it)) == 3
    assert not any(w.is_alive() for w in it._pool.processes)


class Slow(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        time.sleep(5)
        return i


def test_worker_timeout_raises():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="no batch came from the workers? .* within timeout=0.3"):
        next(iter(DataLoader(Slow(), num_workers=1, timeout=0.3)))
    assert time.monotonic() - start < 3


def test_reachable_as_in_pytorch():
    assert lm.utils.data.DataLoader is DataLoader  # torch.utils.data.DataLoader's spelling
    from lamina.utils.data.dataloader import default_collate as collate

    assert collate is default_collate


def test_loading_does_not_need_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch fails
        "import lamina as lm\n"
        "from lamina.utils.data import DataLoader, TensorDataset\n"
        "ds = TensorDataset(lm.asarray([1, 2, 3]))\n"
        "print([b[0].tolist() for b in DataLoader(ds, batch_size=2, num_workers=1)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[[1, 2], [3]]"
