"""Layers for ``tenet.train``: a model is a list of them, fitted to the dataset's sample shape
(``[C, H, W]``) and classes when training starts; the last must be a ``Linear`` of as many
outputs as the dataset has classes. Parameters are named ``<name>.weight`` and ``<name>.bias``
(He-normal weights from the training seed, zero biases), as the bundled models' are::

    import tenet
    from tenet import nn
    model = [nn.Flatten(), nn.Linear("hidden", 128), nn.ReLU(), nn.Linear("out", 10)]
    report = tenet.train("digits", model=model, seed=1)
"""

from typing import Tuple


class Linear:
    """``x @ W + b`` on flat samples (put a ``Flatten`` before it)."""

    def __init__(self, name: str, outputs: int):
        self.name, self.outputs = name, int(outputs)

    def spec(self) -> Tuple:
        return ("linear", self.name, self.outputs)


class Conv2d:
    """A square convolution with stride 1 and a bias, on ``[C, H, W]`` samples."""

    def __init__(self, name: str, channels: int, kernel: int = 3, padding: int = 1):
        self.name, self.channels, self.kernel, self.padding = name, int(channels), int(kernel), int(padding)

    def spec(self) -> Tuple:
        return ("conv2d", self.name, self.channels, self.kernel, self.padding)


class ReLU:
    def spec(self) -> Tuple:
        return ("relu",)


class MaxPool2d:
    """Max pooling over ``size × size`` windows with stride ``size``."""

    def __init__(self, size: int = 2):
        self.size = int(size)

    def spec(self) -> Tuple:
        return ("max_pool2d", self.size)


class Flatten:
    def spec(self) -> Tuple:
        return ("flatten",)
