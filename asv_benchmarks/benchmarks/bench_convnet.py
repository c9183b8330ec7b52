"""One training step (forward, cross-entropy loss, backward, SGD step) of each of
``python -m lamina.bench convnet``'s models -- AlexNet-, VGG- and Inception-v1-like nets
on 64 x 64 float32 images, 100 classes -- at batch 8, NCHW, on one and on two threads
(the issue's 1 -> 2 thread scaling). ``peakmem_`` is the process's peak resident
memory (asv's measure, which includes the interpreter, lamina and the model: read it
as a trend). The SGD steps change the memoized model's weights a little each call,
which changes no shape and so no timing.
"""

from lamina.tools.bench import convnet

from .common import Benchmark, max_threads, memo, threads, warm

BATCH = 8


class TrainStep(Benchmark):
    params = [list(convnet.ARCHITECTURES), [1, 2]]
    param_names = ["model", "threads"]
    label = "convnet train step"

    def setup(self, model, n_threads):
        if n_threads > max_threads():
            raise NotImplementedError  # asv's way to skip a combination
        lib = memo(("convnet lamina",), convnet._lamina)
        wrap = self.wrapper()
        self._threads = threads(n_threads)
        self._threads.__enter__()

        def make():
            net = wrap(convnet.build(convnet.ARCHITECTURES[model], lib))
            return convnet.step(lib, net, "train", BATCH, "NCHW")

        self.step = memo((self.label, model), make)
        try:  # twice: a compiled model's second call runs its plans, as the timed ones do
            warm((self.label, model, n_threads), lambda: (self.step(), self.step()))
        except Exception as e:
            self._threads.__exit__(None, None, None)
            raise NotImplementedError(f"{self.label} cannot run {model}: {e}") from None

    def wrapper(self):
        """What the model is run through: itself, here."""
        return lambda net: net

    def teardown(self, model, n_threads):
        self._threads.__exit__(None, None, None)

    def time_train_step(self, model, n_threads):
        self.step()

    def peakmem_train_step(self, model, n_threads):
        self.step()


class CompiledTrainStep(TrainStep):
    """``TrainStep`` with the model compiled by lamina.jit (forward and backward as one
    joint graph; the loss and SGD step as in eager): ``bench convnet --jit``'s
    lamina.jit column. Skipped on commits without lamina.jit, and for a model it cannot
    train (the skip names the error)."""

    label = "convnet compiled train step"

    def wrapper(self):
        try:
            return convnet.compiler("lamina.jit", None)
        except (AttributeError, ImportError):
            raise NotImplementedError("this commit has no lamina.jit") from None
