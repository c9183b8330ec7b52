"""Run real Array API consumers on lamina tensors and compare them with NumPy.

    python examples/array_api_consumers.py [-v] [FILTER]
    python examples/array_api_consumers.py --sklearn-tests[=DEVICE]

Each check runs a scikit-learn estimator or function (with
``sklearn.config_context(array_api_dispatch=True)``), a SciPy function (with
``SCIPY_ARRAY_API=1``, which this script sets) or an array-api-extra function on
NumPy arrays, then on the same data as lamina tensors (float64, float32, strided views,
on a device other than the CPU) and as array-api-strict arrays (float64, float32, on
its device1), and compares each result with NumPy's: shape, dtype and values (to a
tolerance relative to the results' scale, looser in float32). A failure is lamina's
when array-api-strict gets NumPy's result in the same mode; the others are the
consumer's, and the script says why (CONSUMER_LIMITS). ``-v`` prints each failure's
traceback, FILTER keeps the checks whose name contains it. ``--sklearn-tests`` runs
scikit-learn's own array API tests (about 1,000, two minutes) with lamina as their
namespace, on DEVICE if given (``counting``, the example plugin's device).

scikit-learn, SciPy, array-api-compat and array-api-extra are not lamina dependencies:
install them beside lamina (``pip install scikit-learn scipy array-api-compat
array-api-extra``) to run this script. The consumers missing are reported as skipped.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from collections.abc import Callable

os.environ.setdefault("SCIPY_ARRAY_API", "1")  # before SciPy or scikit-learn import

import numpy as np

import lamina as lm

CHECKS: list[tuple[str, str, Callable]] = []


def check(consumer: str, name: str):
    """Register ``fn(xp, asarray)`` as a check; it returns what to compare."""

    def register(fn):
        CHECKS.append((consumer, name, fn))
        return fn

    return register


# ---------------------------------------------------------------------------- data

RNG = np.random.default_rng(0)
X = RNG.standard_normal((60, 5))
X_POS = np.abs(X) + 0.1
Y_CLASS = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1).astype(np.int64)
Y_BIN = (X[:, 0] > 0).astype(np.int64)
Y_REG = X @ np.array([1.0, -2.0, 0.5, 0.0, 3.0]) + 0.1 * RNG.standard_normal(60)
SCORES = 1 / (1 + np.exp(-(X[:, 0] + 0.3 * RNG.standard_normal(60))))
PRED_BIN = (SCORES > 0.5).astype(np.int64)
PRED_CLASS = np.roll(Y_CLASS, 3)
Y_POS = np.abs(Y_REG) + 0.5
PRED_POS = Y_POS + 0.3 * RNG.standard_normal(60) ** 2


def convert(asarray, values):
    """``values`` with each NumPy array made by ``asarray`` (Python scalars stay)."""
    return [asarray(v) if isinstance(v, np.ndarray) else v for v in values]


# ------------------------------------------------------------------- scikit-learn


def sklearn_checks():
    import sklearn  # noqa: F401  (fails here when scikit-learn is missing)
    from sklearn import (
        calibration,
        decomposition,
        discriminant_analysis,
        kernel_approximation,
        linear_model,
        metrics,
        mixture,
        model_selection,
        naive_bayes,
        pipeline,
        preprocessing,
    )
    from sklearn.metrics import pairwise

    def estimator(name, make, attributes, method="transform", y=None, data=None):
        @check("sklearn", name)
        def run(xp, asarray):
            Xa = asarray(X if data is None else data)
            est = make()
            est = est.fit(Xa) if y is None else est.fit(Xa, asarray(y))
            return [getattr(est, a) for a in attributes] + [getattr(est, method)(Xa)]

    LDA = discriminant_analysis.LinearDiscriminantAnalysis
    estimator(
        "LinearDiscriminantAnalysis(solver='svd')",
        lambda: LDA(solver="svd"),
        ["coef_", "intercept_", "means_"],
        "predict_proba",
        Y_CLASS,
    )
    estimator(
        "LinearDiscriminantAnalysis(solver='eigen')",
        lambda: LDA(solver="eigen"),
        ["coef_", "intercept_"],
        "predict",
        Y_CLASS,
    )
    estimator(
        "LinearDiscriminantAnalysis.transform",
        lambda: LDA(solver="svd"),
        ["explained_variance_ratio_"],
        "transform",
        Y_CLASS,
    )
    for solver in ("full", "covariance_eigh", "randomized"):
        estimator(
            f"PCA(svd_solver='{solver}')",
            lambda solver=solver: decomposition.PCA(
                n_components=3, svd_solver=solver, random_state=0
            ),
            ["explained_variance_", "singular_values_", "mean_"],
            "transform",
        )
    for solver in ("svd", "auto"):
        estimator(
            f"Ridge(solver='{solver}')",
            lambda solver=solver: linear_model.Ridge(alpha=0.5, solver=solver),
            ["coef_", "intercept_"],
            "predict",
            Y_REG,
        )
    estimator(
        "RidgeCV",
        lambda: linear_model.RidgeCV(alphas=(0.1, 1.0, 10.0)),
        ["coef_", "alpha_"],
        "predict",
        Y_REG,
    )
    estimator(
        "RidgeClassifierCV",
        lambda: linear_model.RidgeClassifierCV(alphas=(0.1, 1.0)),
        ["coef_"],
        "decision_function",
        Y_CLASS,
    )
    estimator(
        "LogisticRegression",
        lambda: linear_model.LogisticRegression(),
        ["coef_", "intercept_"],
        "predict_proba",
        Y_CLASS,
    )
    estimator(
        "PoissonRegressor",
        lambda: linear_model.PoissonRegressor(),
        ["coef_", "intercept_"],
        "predict",
        Y_POS,
    )
    estimator(
        "GaussianNB",
        lambda: naive_bayes.GaussianNB(),
        ["theta_", "var_", "class_prior_"],
        "predict_proba",
        Y_CLASS,
    )
    estimator(
        "Nystroem",
        lambda: kernel_approximation.Nystroem(n_components=10, random_state=0),
        ["normalization_"],
    )
    estimator("StandardScaler", preprocessing.StandardScaler, ["mean_", "scale_"])
    estimator("MinMaxScaler", preprocessing.MinMaxScaler, ["data_min_", "scale_"])
    estimator("MaxAbsScaler", preprocessing.MaxAbsScaler, ["max_abs_"])
    estimator("Normalizer", preprocessing.Normalizer, [])
    estimator("Binarizer", lambda: preprocessing.Binarizer(threshold=0.2), [])
    estimator("PolynomialFeatures", lambda: preprocessing.PolynomialFeatures(2), [])
    estimator(
        "KernelCenterer",
        preprocessing.KernelCenterer,
        ["K_fit_rows_"],
        data=X @ X.T,
    )

    @check("sklearn", "LabelEncoder")
    def label_encoder(xp, asarray):
        le = preprocessing.LabelEncoder().fit(asarray(Y_CLASS))
        return [le.classes_, le.transform(asarray(Y_CLASS[::-1]))]

    @check("sklearn", "LabelBinarizer")
    def label_binarizer(xp, asarray):
        lb = preprocessing.LabelBinarizer().fit(asarray(Y_CLASS))
        return [lb.classes_, lb.transform(asarray(Y_CLASS))]

    @check("sklearn", "train_test_split")
    def split(xp, asarray):
        return model_selection.train_test_split(
            asarray(X), asarray(Y_CLASS), test_size=0.25, random_state=0
        )

    def metric(name, fn, *data, **kwargs):
        @check("sklearn", name)
        def run(xp, asarray):
            return fn(
                *convert(asarray, data), **dict(zip(kwargs, convert(asarray, kwargs.values())))
            )

    classification = [
        "accuracy_score",
        "balanced_accuracy_score",
        "cohen_kappa_score",
        "confusion_matrix",
        "hamming_loss",
        "zero_one_loss",
        "multilabel_confusion_matrix",
    ]
    for name in classification:
        metric(name, getattr(metrics, name), Y_CLASS, PRED_CLASS)
    for name in ("f1_score", "precision_score", "recall_score", "jaccard_score"):
        metric(name, getattr(metrics, name), Y_CLASS, PRED_CLASS, average="macro")
    metric("fbeta_score", metrics.fbeta_score, Y_BIN, PRED_BIN, beta=0.5)
    for name in ("roc_curve", "precision_recall_curve", "det_curve"):
        metric(name, getattr(metrics, name), Y_BIN, SCORES)
    for name in ("average_precision_score", "brier_score_loss", "log_loss"):
        metric(name, getattr(metrics, name), Y_BIN, SCORES)
    regression = [
        "r2_score",
        "explained_variance_score",
        "mean_absolute_error",
        "mean_squared_error",
        "root_mean_squared_error",
        "median_absolute_error",
        "max_error",
        "mean_absolute_percentage_error",
        "mean_pinball_loss",
        "d2_absolute_error_score",
        "d2_pinball_score",
    ]
    for name in regression:
        metric(name, getattr(metrics, name), Y_REG, Y_REG + SCORES)
    positive = [
        "mean_squared_log_error",
        "root_mean_squared_log_error",
        "mean_poisson_deviance",
        "mean_gamma_deviance",
        "mean_tweedie_deviance",
        "d2_tweedie_score",
    ]
    for name in positive:
        metric(name, getattr(metrics, name), Y_POS, PRED_POS)

    one_set = [
        "cosine_similarity",
        "cosine_distances",
        "euclidean_distances",
        "manhattan_distances",
        "linear_kernel",
        "polynomial_kernel",
        "rbf_kernel",
        "sigmoid_kernel",
        "laplacian_kernel",
        "pairwise_distances",
        "pairwise_kernels",
    ]
    for name in one_set:
        metric(name, getattr(pairwise, name), X[:20], X[20:35])
    for name in ("additive_chi2_kernel", "chi2_kernel"):
        metric(name, getattr(pairwise, name), X_POS[:20], X_POS[20:35])
    for name in ("paired_euclidean_distances", "paired_manhattan_distances"):
        metric(name, getattr(pairwise, name), X[:20], X[20:40])
    metric("paired_cosine_distances", pairwise.paired_cosine_distances, X[:20], X[20:40])
    metric("pairwise_distances_argmin", metrics.pairwise_distances_argmin, X[:20], X)
    metric(
        "pairwise_distances(metric='cosine')",
        metrics.pairwise_distances,
        X[:20],
        X[20:35],
        metric="cosine",
    )

    # the same functions on other paths: weights, several outputs, options
    W = RNG.uniform(0.5, 2.0, 60)
    Y2 = np.stack([Y_REG, Y_POS], axis=1)
    P2 = Y2 + np.stack([SCORES, SCORES**2], axis=1)
    for name in ("accuracy_score", "f1_score", "confusion_matrix"):
        extra = {"average": "weighted"} if name == "f1_score" else {}
        metric(f"{name}(sample_weight)", getattr(metrics, name), Y_CLASS, PRED_CLASS,
               sample_weight=W, **extra)  # fmt: skip
    metric("confusion_matrix(normalize='true')", metrics.confusion_matrix, Y_CLASS,
           PRED_CLASS, normalize="true")  # fmt: skip
    for name in ("r2_score", "mean_squared_error", "median_absolute_error", "mean_pinball_loss"):
        metric(f"{name}(sample_weight)", getattr(metrics, name), Y_REG, Y_REG + SCORES,
               sample_weight=W)  # fmt: skip
        metric(f"{name}(2 outputs, raw_values)", getattr(metrics, name), Y2, P2,
               multioutput="raw_values")  # fmt: skip
    metric("roc_curve(drop_intermediate=False)", metrics.roc_curve, Y_BIN, SCORES,
           drop_intermediate=False)  # fmt: skip
    metric("roc_auc_score", metrics.roc_auc_score, Y_BIN, SCORES)
    estimator("PCA(n_components=0.9, whiten)",
              lambda: decomposition.PCA(n_components=0.9, whiten=True, svd_solver="full"),
              ["n_components_", "components_"])  # fmt: skip
    estimator("Ridge(2 targets)", lambda: linear_model.Ridge(alpha=0.5, solver="svd"),
              ["coef_", "intercept_"], "predict", Y2)  # fmt: skip
    estimator("LogisticRegression(binary)", linear_model.LogisticRegression,
              ["coef_", "intercept_"], "decision_function", Y_BIN)  # fmt: skip
    estimator("MinMaxScaler(integer data)", preprocessing.MinMaxScaler, ["data_max_"],
              data=np.round(10 * X).astype(np.int64))  # fmt: skip

    estimator("RidgeClassifier", lambda: linear_model.RidgeClassifier(solver="svd"),
              ["coef_"], "predict", Y_CLASS)  # fmt: skip
    for covariance in ("full", "tied", "diag", "spherical"):
        estimator(f"GaussianMixture(covariance_type='{covariance}')",
                  lambda covariance=covariance: mixture.GaussianMixture(
                      3, covariance_type=covariance, init_params="random_from_data",
                      random_state=0),
                  ["weights_", "means_"], "predict_proba")  # fmt: skip
    estimator("CalibratedClassifierCV(method='temperature')",
              lambda: calibration.CalibratedClassifierCV(
                  linear_model.LogisticRegression(), method="temperature"),
              [], "predict_proba", Y_CLASS)  # fmt: skip
    estimator("Pipeline(StandardScaler, PCA, Ridge)",
              lambda: pipeline.make_pipeline(
                  preprocessing.StandardScaler(), decomposition.PCA(3),
                  linear_model.Ridge(solver="svd")),
              [], "predict", Y_REG)  # fmt: skip
    estimator("GridSearchCV(Ridge)",
              lambda: model_selection.GridSearchCV(
                  linear_model.Ridge(solver="svd"), {"alpha": [0.1, 1.0, 10.0]}),
              ["best_score_"], "predict", Y_REG)  # fmt: skip

    @check("sklearn", "cross_val_score(Ridge)")
    def cross_validated(xp, asarray):
        ridge = linear_model.Ridge(solver="svd")
        return list(model_selection.cross_val_score(ridge, asarray(X), asarray(Y_REG)))

    @check("sklearn", "StandardScaler(sample_weight)")
    def scaler_weighted(xp, asarray):
        sc = preprocessing.StandardScaler().fit(asarray(X), sample_weight=asarray(W))
        return [sc.mean_, sc.var_, sc.transform(asarray(X)), sc.inverse_transform(asarray(X))]

    @check("sklearn", "LabelBinarizer.inverse_transform")
    def binarizer_inverse(xp, asarray):
        lb = preprocessing.LabelBinarizer().fit(asarray(Y_CLASS))
        return lb.inverse_transform(lb.transform(asarray(PRED_CLASS)))

    @check("sklearn", "train_test_split(stratify)")
    def split_stratified(xp, asarray):
        y = asarray(Y_CLASS)
        return model_selection.train_test_split(asarray(X), y, stratify=y, random_state=0)


# -------------------------------------------------------------------------- SciPy


def scipy_checks():
    from scipy import fft, integrate, ndimage, signal, special, stats
    from scipy.cluster import vq

    def function(name, fn, *data, **kwargs):
        @check("scipy", name)
        def run(xp, asarray):
            result = fn(
                *convert(asarray, data), **dict(zip(kwargs, convert(asarray, kwargs.values())))
            )
            return list(result) if isinstance(result, tuple) else result

    A = X[:12]
    for name in ("logsumexp", "softmax", "log_softmax"):
        function(f"special.{name}", getattr(special, name), A, axis=1)
    for name in ("expit", "erf", "erfc", "ndtr", "log_ndtr", "i0"):
        function(f"special.{name}", getattr(special, name), A)
    for name in ("gammaln", "entr"):
        function(f"special.{name}", getattr(special, name), X_POS[:12])
    function("special.xlogy", special.xlogy, X_POS[:12], X_POS[12:24])
    function("special.rel_entr", special.rel_entr, X_POS[:12], X_POS[12:24])
    for name in ("skew", "kurtosis", "zscore", "sem", "iqr", "rankdata", "tmean", "circmean"):
        function(f"stats.{name}", getattr(stats, name), A)
    for name in ("gmean", "hmean", "variation", "entropy", "gstd"):
        function(f"stats.{name}", getattr(stats, name), X_POS[:12])
    function("stats.moment", stats.moment, A, order=3)
    function("stats.quantile", stats.quantile, A, 0.3, axis=0)
    function("stats.trim_mean", stats.trim_mean, A, 0.1)
    function("stats.pearsonr", stats.pearsonr, X[:, 0], X[:, 1])
    function("stats.ttest_ind", stats.ttest_ind, X[:, 0], X[:, 1])
    function("stats.ttest_1samp", stats.ttest_1samp, X[:, 0], 0.0)
    function("stats.chatterjeexi", stats.chatterjeexi, X[:, 0], X[:, 1])
    function("stats.differential_entropy", stats.differential_entropy, X[:, 0])
    for name in ("fft", "rfft", "ifft", "fft2", "dct", "dst", "idct"):
        function(f"fft.{name}", getattr(fft, name), A)
    function("integrate.trapezoid", integrate.trapezoid, A)
    function("integrate.cumulative_trapezoid", integrate.cumulative_trapezoid, A)
    function("cluster.vq.whiten", vq.whiten, A)
    function("cluster.vq.vq", vq.vq, A, A[:3])
    for name in ("convolve", "fftconvolve", "correlate"):
        function(f"signal.{name}", getattr(signal, name), X[:, 0], X[:5, 1])
    function("signal.detrend", signal.detrend, A)
    function("signal.lfilter", signal.lfilter, X[:2, 0], X[:1, 1], X[:, 2])
    function("ndimage.gaussian_filter", ndimage.gaussian_filter, A, 1.0)
    function("ndimage.sum_labels", ndimage.sum_labels, A, (A > 0).astype(np.int64))


# ----------------------------------------------------------------- array-api-extra


def extra_checks():
    import array_api_extra as xpx

    def function(name, fn, *data, **kwargs):
        @check("array-api-extra", name)
        def run(xp, asarray):
            return fn(
                *convert(asarray, data), **dict(zip(kwargs, convert(asarray, kwargs.values())))
            )

    A = X[:6, :4]
    function("atleast_nd", lambda x: xpx.atleast_nd(x, ndim=3), A)
    function("cov", xpx.cov, A.T)
    function("create_diagonal", xpx.create_diagonal, A[0])
    function("expand_dims", lambda x: xpx.expand_dims(x, axis=(0, 2)), A)
    function("kron", xpx.kron, A[:2, :2], A[2:5, 1:3])
    function("nunique", xpx.nunique, Y_CLASS)
    function("pad", lambda x: xpx.pad(x, 2), A)
    function("setdiff1d", xpx.setdiff1d, Y_CLASS, np.array([1]))
    function("sinc", xpx.sinc, X[:, 0])
    function("one_hot", lambda y: xpx.one_hot(y, 3), Y_CLASS)
    function("broadcast_shapes", lambda: xpx.broadcast_shapes((2, 1), (1, 3)))
    function("isclose", xpx.isclose, A, A + 1e-9)
    function("nan_to_num", xpx.nan_to_num, np.array([1.0, np.nan, np.inf, -np.inf]))
    function("partition", lambda x: xpx.partition(x, 3), X[:, 0])
    function("argpartition", lambda x: xpx.argpartition(x, 3), X[:, 0])
    function("isin", xpx.isin, Y_CLASS, np.array([0, 2]))
    function("union1d", xpx.union1d, Y_CLASS, np.array([5, 1]))
    function(
        "at(...).set",
        lambda x: xpx.at(x)[1:3].set(0.0),
        X[:, 0],
    )
    function(
        "at(...).add (copy)",
        lambda x: xpx.at(x)[::2].add(1.0, copy=True),
        X[:, 0],
    )
    for name in ("nansum", "nanmean", "nanmax", "nanmin"):
        function(name, getattr(xpx, name), np.where(A > 1, np.nan, A))
    for name in ("angle", "deg2rad", "rad2deg"):
        function(name, getattr(xpx, name), A)
    function("searchsorted", xpx.searchsorted, np.sort(X[:, 0]), X[:5, 1])
    function(
        "default_dtype",  # compared through an array of that dtype
        lambda x: array_namespace(x).zeros(1, dtype=xpx.default_dtype(array_namespace(x))),
        A,
    )
    function("tril_indices", lambda x: xpx.tril_indices(4, xp=array_namespace(x)), A)
    function("triu_indices", lambda x: xpx.triu_indices(4, offset=1, xp=array_namespace(x)), A)
    function("diag_indices", lambda x: xpx.diag_indices(3, xp=array_namespace(x)), A)
    function("unravel_index", lambda i: xpx.unravel_index(i, (3, 4)), np.array([0, 5, 11]))
    function("apply_where", lambda x: xpx.apply_where(x > 0, x, xp_sqrt, fill_value=-1.0), X[:, 0])


def array_namespace(*arrays):
    import array_api_compat

    return array_api_compat.array_namespace(*arrays)


def xp_sqrt(x):
    return array_namespace(x).sqrt(x)


# ------------------------------------------------------------------------ running


def to_numpy(value):
    """``value`` (a result of a check) as nested lists of NumPy arrays."""
    if isinstance(value, list | tuple):
        return [to_numpy(v) for v in value]
    if isinstance(value, np.ndarray | np.generic | int | float | bool | complex):
        return np.asarray(value)
    if isinstance(value, lm.Tensor):
        return np.asarray(value.to_device("cpu"))
    import array_api_strict as strict  # an array-api-strict array

    return np.asarray(strict.asarray(value, device=strict.Device("CPU_DEVICE")))


def compare(expected, actual, tolerance, path="result"):
    """Raise AssertionError naming the first result that differs from NumPy's."""
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), (
            f"{path}: {len(expected)} results expected"
        )
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            compare(e, a, tolerance, f"{path}[{i}]")
        return
    assert expected.shape == actual.shape, f"{path} shape {actual.shape}, NumPy's {expected.shape}"
    assert expected.dtype == actual.dtype, f"{path} dtype {actual.dtype}, NumPy's {expected.dtype}"
    # tolerance is relative to the results' scale: an element near zero has no precision
    # of its own (a float32 sum near 0 differs from NumPy's in the last bits of the terms)
    scale = float(np.max(np.abs(expected), initial=1.0, where=np.isfinite(expected)))
    if not np.allclose(actual, expected, rtol=tolerance, atol=tolerance * scale, equal_nan=True):
        error = np.max(np.abs(actual - expected)) if actual.size else 0
        raise AssertionError(f"{path} values differ (max abs difference {error:.3g})")


def numpy_result(value):
    """Where ``value`` (a result on other arrays) holds a NumPy array, or None: the
    consumer left the namespace it was given."""
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if (path := numpy_result(v)) is not None:
                return f"[{i}]{path}"
        return None
    return "" if isinstance(value, np.ndarray) and value.ndim > 0 else None


def mode_data(mode):
    """How each mode turns a check's NumPy data into its arrays: (namespace, asarray)."""

    def cast(data):
        data = np.asarray(data)
        single = mode.endswith("32") and data.dtype == np.float64
        return data.astype(np.float32) if single else data

    if mode == "strided":  # a view with a step over a bigger lamina tensor, same values

        def strided(data):
            data = np.asarray(data)
            if data.ndim == 0:
                return lm.asarray(data)
            doubled = np.repeat(data, 2, axis=-1)
            return lm.asarray(doubled)[..., ::2]

        return lm, strided
    if mode == "device":  # the first device that is not the CPU, third-party ones too

        def on_device(data):
            return lm.asarray(data, device=OTHER_DEVICES[0])

        return lm, on_device
    if mode.startswith("strict"):
        import array_api_strict as strict

        device = strict.Device("device1" if mode == "strict-device" else "CPU_DEVICE")
        return strict, lambda data: strict.asarray(cast(data), device=device)
    if mode.startswith("numpy"):
        return np, cast
    return lm, lambda data: lm.asarray(cast(data))


OTHER_DEVICES = [d for d in lm.__array_namespace_info__().devices() if d != lm.Device("cpu")]
LAMINA_MODES = ("float64", "float32", "strided") + (("device",) if OTHER_DEVICES else ())
MODES = (*LAMINA_MODES, "strict", "strict32", "strict-device")
STRICT_TWIN = {"float64": "strict", "float32": "strict32", "strided": "strict"}
STRICT_TWIN["device"] = "strict-device"

# Why the checks that fail on array-api-strict too fail: the consumer, not lamina.
_SCIPY_TO_NUMPY = (
    "SciPy computes these in NumPy (np.asarray of the input), which a device array "
    "refuses, as array-api-strict's device1 does"
)
_SCIPY_NO_DEVICE = (
    "SciPy makes a new array without device= and combines it with the input, an error "
    "on any device but the default (array-api-strict's too)"
)
CONSUMER_LIMITS = {
    "LinearDiscriminantAnalysis(solver='eigen')": (
        "the eigen solver is NumPy code (np.atleast_2d, scipy.linalg.eigh on the "
        "NumPy covariance); scikit-learn supports the array API for solver='svd'"
    ),
    "roc_curve": (
        "scikit-learn calls xp.diff(fps, 2) to drop intermediate thresholds; n is "
        "keyword-only in the standard, diff(x, /, *, axis=-1, n=1, ...)"
    ),
    "roc_auc_score": "calls roc_curve (xp.diff(fps, 2), see roc_curve)",
    "manhattan_distances": (
        "on NumPy scikit-learn calls scipy's cdist, which computes in float64; its "
        "array API path keeps float32, as the standard's promotion says"
    ),
    "laplacian_kernel": "manhattan_distances inside (float64 on NumPy, float32 else)",
    "PoissonRegressor": (
        "lbfgs in float32 stops at another iterate when sums round differently "
        "(array-api-strict's float32 result differs from NumPy's too)"
    ),
    "CalibratedClassifierCV(method='temperature')": (
        "a scalar optimizer (minimize_scalar) whose float32 optimum moves with the "
        "rounding of sums (array-api-strict differs from NumPy too)"
    ),
}
for _name in ("expit", "erf", "erfc", "ndtr", "log_ndtr", "i0", "gammaln", "entr"):
    CONSUMER_LIMITS[f"special.{_name}"] = _SCIPY_TO_NUMPY
for _name in ("stats.entropy", "stats.pearsonr", "fft.dct", "fft.dst", "fft.idct"):
    CONSUMER_LIMITS[_name] = _SCIPY_TO_NUMPY
for _name in ("vq.vq", "signal.convolve", "signal.correlate", "signal.detrend"):
    CONSUMER_LIMITS[_name.replace("vq.", "cluster.vq.")] = _SCIPY_TO_NUMPY
for _name in ("signal.lfilter", "ndimage.gaussian_filter", "ndimage.sum_labels"):
    CONSUMER_LIMITS[_name] = _SCIPY_TO_NUMPY
for _name in ("stats.rankdata", "stats.chatterjeexi", "stats.ttest_ind", "stats.ttest_1samp"):
    CONSUMER_LIMITS[_name] = _SCIPY_NO_DEVICE


def _fails_on_lamina_only(results) -> bool:
    """A failure is lamina's when the consumer gets NumPy's result on array-api-strict in
    the same mode (else the consumer leaves the standard, see CONSUMER_LIMITS)."""
    return any(results[m][0] and not results[STRICT_TWIN[m]][0] for m in LAMINA_MODES)


def _numpys_default_dtype_mends(fn, results) -> bool:
    """Whether a check that fails on lamina only stops doing so once lamina's default
    dtype is NumPy's (float64): then the difference is the default (the dtype of Python
    floats and of integers made floating), not a lamina bug."""
    default = lm.get_default_dtype()
    if default == lm.float64:
        return False
    lm.set_default_dtype(lm.float64)
    try:
        again = {m: run_one(fn, m) if m in LAMINA_MODES else r for m, r in results.items()}
    finally:
        lm.set_default_dtype(default)
    return not _fails_on_lamina_only(again)


def run_one(fn, mode):
    """None when ``fn`` on ``mode``'s arrays gives NumPy's result, else why not."""
    import sklearn

    with sklearn.config_context(array_api_dispatch=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the consumers' warnings are NumPy's too
        try:
            expected = to_numpy(fn(np, mode_data("numpy32" if mode.endswith("32") else "numpy")[1]))
        except Exception as error:
            return f"fails on NumPy too: {type(error).__name__}: {error}", traceback.format_exc()
        xp, asarray = mode_data(mode)
        try:
            result = fn(xp, asarray)
        except Exception as error:  # the table reports it
            return f"{type(error).__name__}: {error}".splitlines()[0], traceback.format_exc()
    if (path := numpy_result(result)) is not None:
        return f"result{path} is a NumPy array", ""
    try:
        # float32 sums in another order differ in their last bits, also once a consumer
        # returns them as Python floats
        compare(expected, to_numpy(result), 1e-5 if mode.endswith("32") else 1e-9)
    except AssertionError as error:
        return str(error), traceback.format_exc()
    return None, ""


class SklearnTestsOnLamina:
    """A pytest plugin giving scikit-learn's own array API tests lamina (on ``device``)
    as their only namespace: they compare each estimator and metric on it with NumPy."""

    def __init__(self, device: str | None):
        self.device = device

    def pytest_configure(self, config):
        import sklearn.utils._array_api as api
        import sklearn.utils._testing as testing

        def combinations(include_numpy_namespaces=True):
            for dtype in ("float64", "float32"):
                yield "lamina", self.device, dtype

        for_tests = testing._array_api_for_tests

        def array_api_for_tests(namespace, device_name=None, dtype_name=None):
            xp, device = for_tests(namespace, device_name, dtype_name)
            return xp, device if device_name is None else lm.Device(device_name)

        # the test modules import these when pytest collects them, after this hook
        api.yield_namespaces = lambda include_numpy_namespaces=True: iter(["lamina"])
        api.yield_namespace_device_dtype_combinations = combinations
        testing._array_api_for_tests = array_api_for_tests


def sklearn_tests(device: str | None) -> int:
    """Run scikit-learn's array API tests on lamina; pytest's exit status."""
    import pytest

    arguments = ["--pyargs", "sklearn", "-k", "lamina", "-q", "-p", "no:cacheprovider"]
    return pytest.main([*arguments, "-W", "ignore"], plugins=[SklearnTestsOnLamina(device)])


def main(argv: list[str]) -> int:
    for argument in argv:
        if argument.startswith("--sklearn-tests"):
            return sklearn_tests(argument.partition("=")[2] or None)
    verbose = "-v" in argv
    filters = [a for a in argv if a != "-v"]
    skipped = []
    for name, register in (
        ("scikit-learn", sklearn_checks),
        ("SciPy", scipy_checks),
        ("array-api-extra", extra_checks),
    ):
        try:
            register()
        except ImportError as error:
            skipped.append(f"{name}: {error}")
    if "sklearn" not in sys.modules:
        print("scikit-learn is not installed: nothing to run")
        return 0
    import scipy
    import sklearn

    print(
        f"lamina (Array API {lm.__array_api_version__}) against NumPy {np.__version__}; "
        f"scikit-learn {sklearn.__version__}, SciPy {scipy.__version__}, "
        f"SCIPY_ARRAY_API={os.environ['SCIPY_ARRAY_API']}"
    )
    print(
        "float64, float32: lamina tensors of that dtype; strided: float64 views with a "
        f"step; device: float64 on {OTHER_DEVICES[0] if OTHER_DEVICES else '(none)'};\n"
        "strict, strict32, strict-device: array-api-strict float64 and float32, and "
        "float64 on its device1\n(does the consumer keep to the standard?)\n"
    )
    rows, reasons, lamina_only, default_dtype_only = [], {}, [], []
    for consumer, name, fn in CHECKS:
        if filters and not any(f in name for f in filters):
            continue
        results = {mode: run_one(fn, mode) for mode in MODES}
        cells = []
        for mode, (reason, tb) in results.items():
            if verbose and tb:
                print(f"{name} [{mode}]\n{tb}")
            if reason is None:
                cells.append("ok")
            else:
                cells.append(f"FAIL ({reasons.setdefault(reason, len(reasons) + 1)})")
        if _fails_on_lamina_only(results):
            if _numpys_default_dtype_mends(fn, results):
                default_dtype_only.append(name)
            else:
                lamina_only.append(name)
        rows.append((consumer, name, *cells))
    header = ("consumer", "function", *MODES)
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip())
    print()
    for reason, note in reasons.items():
        print(f"({note}) {reason}")
    failing = [r[1] for r in rows if any(c != "ok" for c in r[2 : 2 + len(LAMINA_MODES)])]
    why: dict[str, list[str]] = {}
    for name in failing:
        if name not in lamina_only:
            why.setdefault(CONSUMER_LIMITS.get(name, "see the failures above"), []).append(name)
    if default_dtype_only:
        why[
            f"lamina's default floating dtype is {lm.get_default_dtype()} (PyTorch's), NumPy's "
            "and array-api-strict's float64: with lm.set_default_dtype(lm.float64) none of "
            "these fails on lamina only"
        ] = default_dtype_only
    if why:
        print("\nWhy the consumers fail (on array-api-strict or NumPy alike):")
    for reason, names in why.items():
        print(f"- {', '.join(names)}:\n    {reason}")
    print(
        f"\n{len(rows) - len(failing)} of {len(rows)} checks give NumPy's result on lamina "
        f"in every mode; {len(lamina_only)} fail on lamina only"
        + (f": {', '.join(lamina_only)}" if lamina_only else "")
    )
    for line in skipped:
        print("skipped", line)
    return 1 if lamina_only else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
