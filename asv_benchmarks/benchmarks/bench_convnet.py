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

    def setup(self, model, n_threads):
        if n_threads > max_threads():
            raise NotImplementedError  # asv's way to skip a combination
        self._threads = threads(n_threads)
        self._threads.__enter__()
        lib = memo(("convnet lamina",), convnet._lamina)

        def make():
            net = convnet.build(convnet.ARCHITECTURES[model], lib)
            return convnet.step(lib, net, "train", BATCH, "NCHW")

        self.step = memo(("convnet train step", model), make)
        warm(("convnet train step", model, n_threads), self.step)

    def teardown(self, model, n_threads):
        self._threads.__exit__(None, None, None)

    def time_train_step(self, model, n_threads):
        self.step()

    def peakmem_train_step(self, model, n_threads):
        self.step()
