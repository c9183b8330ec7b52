"""``lamina.nn`` modules, as PyTorch users know them: ``Module`` with parameters,
buffers, children, train/eval, state dicts, hooks and ``to``; the layers of seed 2's
convnets; containers; losses.

Parameters have lamina's default float dtype (float32, the production dtype of the nn
kernels, like ``lm.randn``'s results; Note [Default dtype]) unless a layer is given
``dtype=``; ``module.double()`` makes a float64 network.

A ``Parameter`` is a tensor that requires grad and is marked as a parameter (lamina's
Tensor is not subclassed: its hot paths test the exact class), so ``isinstance(p,
Parameter)`` holds for exactly the tensors ``Parameter(...)`` made. Assigning one to a
module attribute registers it, as assigning a module registers a child. As in PyTorch,
``copy.deepcopy`` and pickle keep a model's Parameters (the mark travels with the
tensor, Note [Copies]) and its tied weights (one object in the copy), and ``to`` /
``float`` / ``double`` move each distinct parameter once, so ties survive moves too.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from lamina.autograd import no_grad
from lamina.dispatch import meta, ops, rewrites
from lamina.dispatch.arguments import checked
from lamina.dispatch.dtypes import DType, float32, float64
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import Tensor, seal

from . import functional as F
from . import init

_NATIVE_BATCH_NORM = OPERATORS["native_batch_norm"]


class _ParameterType(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, Tensor) and obj.__dict__.get("_is_parameter", False)


class Parameter(metaclass=_ParameterType):
    """``Parameter(data, requires_grad=True)``: a leaf tensor sharing data's storage,
    requiring grad and marked as a module parameter."""

    def __new__(cls, data: Tensor, requires_grad: bool = True) -> Tensor:
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter: data must be a tensor, got {type(data).__name__}")
        p = data.detach()
        if requires_grad:
            p.requires_grad_()
        p._is_parameter = True
        seal(p)  # Note [Sealed storages]
        return p


class _Handle:
    """What ``register_forward_hook`` returns: ``remove()`` takes the hook away."""

    def __init__(self, hooks: dict, hook: Callable) -> None:
        self.hooks, self.key = hooks, object()
        hooks[self.key] = hook

    def remove(self) -> None:
        self.hooks.pop(self.key, None)


class IncompatibleKeys(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


# Note [Module generation]: one count for all modules, bumped whenever any of them
# gains, loses or replaces a parameter, buffer or child (every change of its tables, by
# whatever path) or switches between training and evaluation (not when ``train()`` or
# ``eval()`` finds every module in that mode already: loops that call ``model.train()``
# before every step would re-read the tree at every call). A compiled module
# (lamina.jit) reads which parameters and buffers it has, and its modes, again only
# when the count moved: a guard of one comparison per call, not a walk of the tree.
generation = 0


def _changed() -> None:
    global generation
    generation += 1


class _Table(OrderedDict):
    """A module's parameters, buffers or children (Note [Module generation])."""

    def __setitem__(self, key: str, value: Any) -> None:
        _changed()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        _changed()
        super().__delitem__(key)

    def pop(self, *args: Any) -> Any:
        _changed()
        return super().pop(*args)

    def popitem(self, last: bool = True) -> Any:
        _changed()
        return super().popitem(last)

    def clear(self) -> None:
        _changed()
        super().clear()


class Module:
    """The base of every layer: subclasses set parameters and children as attributes in
    ``__init__`` (after ``super().__init__()``) and define ``forward``."""

    training: bool

    def __init__(self) -> None:
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = _Table()
        d["_buffers"] = _Table()
        d["_persistent"] = set()
        d["_modules"] = _Table()
        d["_forward_hooks"] = OrderedDict()
        d["_forward_pre_hooks"] = OrderedDict()

    # ---------------------------------------------------------- attributes
    def __setattr__(self, name: str, value: Any) -> None:
        params = self.__dict__.get("_parameters")
        if params is None:
            raise AttributeError("call Module.__init__() before assigning attributes")
        if isinstance(value, Parameter):
            self._forget(name, params)
            params[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign {type(value).__name__} as parameter {name!r} "
                    "(a Parameter or None is expected)"
                )
            params[name] = None
        elif isinstance(value, Module):
            self._forget(name, self._modules)
            self._modules[name] = value
        elif name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as child module {name!r}")
            self._modules[name] = None
        elif name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} as buffer {name!r}")
            self._buffers[name] = value
        else:
            if name == "training":  # Note [Module generation]
                _changed()
            object.__setattr__(self, name, value)

    def _forget(self, name: str, keep: dict) -> None:
        """Remove ``name`` from every table but ``keep`` and from the plain attributes."""
        self.__dict__.pop(name, None)
        for table in (self._parameters, self._buffers, self._modules):
            if table is not keep:
                table.pop(name, None)
        if keep is not self._buffers:
            self._persistent.discard(name)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                self._persistent.discard(name)
                return
        object.__delattr__(self, name)

    def _check_name(self, kind: str, name: Any, table: dict) -> None:
        """Refuse, as PyTorch does, a ``kind`` ("parameter", "buffer", "module") name
        that is not a string, is empty, has a dot (named_parameters and state_dict keys
        would be ambiguous) or is already another attribute (a method, a plain
        attribute, or an entry of another table): only ``table``'s own entry may be
        replaced."""
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain ".", got: {name!r}')
        if name not in table and hasattr(self, name):
            raise KeyError(f"attribute {name!r} already exists")

    def register_parameter(self, name: str, param: Tensor | None) -> None:
        """Add a parameter (or None, a declared but absent one) under ``name``."""
        self._check_name("parameter", name, self.__dict__.get("_parameters", {}))
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"cannot assign {type(param).__name__!r} object to parameter {name!r} "
                "(a Parameter or None is required)"
            )
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a tensor that is state but not a parameter (batch norm's running
        statistics); persistent buffers are part of the state dict."""
        self._check_name("buffer", name, self.__dict__.get("_buffers", {}))
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign {type(tensor).__name__!r} object to buffer {name!r} "
                "(a Tensor or None is required)"
            )
        self._buffers[name] = tensor
        if persistent:
            self._persistent.add(name)
        else:
            self._persistent.discard(name)

    def add_module(self, name: str, module: Module | None) -> None:
        """Add a child module under ``name``."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module: {name!r} must be a Module, got {type(module).__name__}")
        self._check_name("module", name, self.__dict__.get("_modules", {}))
        self._modules[name] = module

    # ---------------------------------------------------------- traversal
    def named_modules(self, prefix: str = "", memo: set | None = None) -> Iterator:
        """(name, module) for this module and every descendant, each once."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, child in self._modules.items():
            if child is not None:
                yield name, child

    def children(self) -> Iterator[Module]:
        for _, child in self.named_children():
            yield child

    def _named(self, table: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Tensor]]:
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_name, module in modules:
            for name, t in getattr(module, table).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{mod_name}.{name}" if mod_name else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator:
        """(dotted name, parameter) of this module and (with recurse) its descendants,
        each parameter once."""
        return self._named("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator:
        return self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn`` on every descendant, then on this module; returns self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ---------------------------------------------------------- modes and state
    def train(self, mode: bool = True) -> Module:
        """Training mode (batch norm uses batch statistics, dropout drops), recursively."""
        mode = bool(mode)
        for m in self.modules():
            if m.__dict__.get("training") is not mode:  # Note [Module generation]
                m.__dict__["training"] = mode
                _changed()
        return self

    def eval(self) -> Module:
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the parameters' gradients (or fill them with zeros)."""
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad = ops.zeros_like(p.grad)

    def state_dict(self, prefix: str = "") -> OrderedDict:
        """Every parameter and persistent buffer by dotted name (detached, sharing
        storage with the module's tensors)."""
        state = OrderedDict()
        for mod_name, module in self.named_modules(prefix.rstrip(".")):
            dot = f"{mod_name}." if mod_name else ""
            for name, p in module._parameters.items():
                if p is not None:
                    state[dot + name] = p.detach()
            for name, b in module._buffers.items():
                if b is not None and name in module._persistent:
                    state[dot + name] = b.detach()
        return state

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> IncompatibleKeys:
        """Copy values into the parameters and buffers of the same names (in place:
        optimizers holding the parameters keep working). With ``strict``, missing or
        unexpected keys raise a KeyError; a shape that differs always raises."""
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            value = value if isinstance(value, Tensor) else ops.asarray(value)
            if value.shape != target.shape:
                raise ValueError(
                    f"load_state_dict: {key!r} has shape {value.shape} in the state dict "
                    f"but {target.shape} in the module"
                )
            with no_grad():
                target[...] = ops.astype(value.to(target.device), target.dtype)
        return IncompatibleKeys(missing, unexpected)

    def to(self, device: Any = None, dtype: Any = None) -> Module:
        """Every parameter and buffer moved to ``device`` and/or cast to a floating
        ``dtype`` (``to("cpu")``, ``to(lm.float64)``); returns self. Parameters are
        replaced by new ones (an optimizer must be made after the move). Each distinct
        parameter (and buffer) is moved once and its new tensor put everywhere the old
        one was, so tied weights stay tied."""
        if isinstance(device, DType):  # to(lm.float32)
            device, dtype = None, device
        moved: dict[int, Tensor] = {}  # id of an old tensor -> its new one
        keep = []  # the old tensors, alive while ``moved`` holds their ids
        for module in self.modules():
            for name, p in module._parameters.items():
                if p is not None:
                    if id(p) not in moved:
                        keep.append(p)
                        moved[id(p)] = Parameter(_moved(p, device, dtype), p.requires_grad)
                    module._parameters[name] = moved[id(p)]
            for name, b in module._buffers.items():
                if b is not None:
                    if id(b) not in moved:
                        keep.append(b)
                        moved[id(b)] = _moved(b, device, None if b.dtype.kind != "f" else dtype)
                    module._buffers[name] = moved[id(b)]
        return self

    def float(self) -> Module:
        """Parameters and floating buffers as float32."""
        return self.to(dtype=float32)

    def double(self) -> Module:
        """Parameters and floating buffers as float64."""
        return self.to(dtype=float64)

    # ---------------------------------------------------------- calls
    def forward(self, *args: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    # A module whose forward is one operator call names that operator and gives its
    # arguments, so that Sequential can fuse it with its neighbours (Note [Rewrites]).
    # Only the class that sets ``operator`` takes part, not its subclasses: they may
    # change forward.
    operator: str | None = None

    def operator_args(self, x: Any) -> tuple:
        """The arguments of ``operator``'s call that ``forward(x)`` makes (checked);
        called once per call, so state a forward updates is updated here."""
        raise NotImplementedError(f"{type(self).__name__} has no operator call")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for hook in list(self._forward_pre_hooks.values()):
            changed = hook(self, args)
            if changed is not None:
                args = changed if isinstance(changed, tuple) else (changed,)
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            changed = hook(self, args, out)
            if changed is not None:
                out = changed
        return out

    def register_forward_hook(self, hook: Callable) -> _Handle:
        """``hook(module, args, output)`` after every forward; a value it returns
        replaces the output."""
        return _Handle(self._forward_hooks, hook)

    def register_forward_pre_hook(self, hook: Callable) -> _Handle:
        """``hook(module, args)`` before every forward; a value it returns replaces the
        arguments."""
        return _Handle(self._forward_pre_hooks, hook)

    # ---------------------------------------------------------- printing
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): {_indent(repr(m))}" for name, m in self._modules.items()]
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        body = "\n  ".join(([extra] if extra else []) + lines)
        return f"{type(self).__name__}(\n  {body}\n)"


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def _moved(t: Tensor, device: Any, dtype: Any) -> Tensor:
    out = t.detach()
    if dtype is not None and out.dtype.kind == "f":
        out = ops.astype(out, dtype)
    if device is not None:
        out = out.to(device)
    return out


# ---------------------------------------------------------------- containers


class Sequential(Module):
    """Modules applied one after another: ``Sequential(conv, bn, relu)`` (children
    named "0", "1", ...) or ``Sequential(OrderedDict(conv=conv, ...))``.

    Consecutive children that a declared fusion covers (a BatchNorm2d then a ReLU)
    run as one fused call with the same results when none has hooks or a forward of
    its own (Note [Rewrites]); ``fuse = False``, on the class or one instance (its
    slices keep it), runs them one by one."""

    fuse = True

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def forward(self, x: Any) -> Any:
        modules = list(self._modules.values())
        operators = [_operator(m) for m in modules] if self.fuse else []
        i = 0
        while i < len(modules):
            fusion = rewrites.match(operators[i:]) if operators else None
            if fusion is None:
                x = modules[i](x)
                i += 1
            else:
                n = len(fusion.pattern)
                x = fusion.apply(x, *(m.operator_args for m in modules[i : i + n]))
                i += n
        return x

    def __getitem__(self, index: int | slice) -> Module:
        """A child by position (negative counts from the end), or for a slice a
        Sequential of those children under their own names (``seq[1:3]`` has children
        "1" and "2"), as in PyTorch."""
        if isinstance(index, slice):
            part = Sequential(OrderedDict(list(self._modules.items())[index]))
            if "fuse" in self.__dict__:
                part.fuse = self.fuse
            return part
        return list(self._modules.values())[_position(index, len(self._modules))]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self._modules)), module)
        return self


def _position(index: Any, size: int) -> int:
    """``index`` (an int, or any object with ``__index__``) as a position in a container
    of ``size``; an IndexError naming it when out of range, as PyTorch's containers."""
    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(
            f"container indices must be integers or slices, not {type(index).__name__}"
        ) from None
    if not -size <= i < size:
        raise IndexError(f"index {i} is out of range")
    return i % size


def _operator(m: Module) -> str | None:
    """The operator ``m``'s call makes, where Sequential may fuse it (Note [Rewrites]):
    declared by its own class, and no hook or instance forward to see or change the
    values in between."""
    if m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__:
        return None
    return type(m).__dict__.get("operator")


class ModuleList(Module):
    """A list of modules whose parameters are registered (branches of a block)."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), module)
        return self

    def __getitem__(self, index: int | slice) -> Module | ModuleList:
        """A module by position (negative counts from the end), or for a slice a
        ModuleList of those modules (numbered from "0"), as in PyTorch."""
        if isinstance(index, slice):
            return ModuleList(list(self._modules.values())[index])
        return list(self._modules.values())[_position(index, len(self._modules))]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


# ---------------------------------------------------------------- layers


def _empty(shape: tuple, dtype: Any, device: Any) -> Tensor:
    """A parameter's storage: lamina's default float dtype (as for lm.zeros and lm.randn,
    so that modules and inputs agree) unless ``dtype`` says otherwise."""
    return ops.empty(shape, dtype=dtype, device=device)


def _pair(v: Any) -> tuple[int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


class Linear(Module):
    """y = x @ weight.T + bias; weight (out_features, in_features) and bias start in
    U(-1/sqrt(in_features), 1/sqrt(in_features)), as in PyTorch."""

    @checked
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(_empty((out_features, in_features), dtype, device))
        self.bias = Parameter(_empty((out_features,), dtype, device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features else 0.0
            init.uniform_(self.bias, -bound, bound)

    operator = "linear"

    def operator_args(self, x: Tensor) -> tuple:
        return OPERATORS["linear"].check(x, self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


class Conv2d(Module):
    """2-D convolution; weight (out, in / groups, kH, kW) and bias start in
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * kH * kW, as in PyTorch."""

    @checked
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if padding_mode not in PADDING_MODES:
            modes = ", ".join(repr(m) for m in PADDING_MODES)
            raise ValueError(f"Conv2d: padding_mode must be one of {modes}, got {padding_mode!r}")
        if groups < 1:
            raise ValueError(f"Conv2d: groups must be positive, got {groups}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"Conv2d: groups={groups} must divide in_channels={in_channels} and "
                f"out_channels={out_channels}"
            )
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.dilation, self.groups, self.padding_mode = _pair(dilation), groups, padding_mode
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = Parameter(_empty(shape, dtype, device))
        self.bias = Parameter(_empty((out_channels,), dtype, device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = init.fan_in_and_fan_out(self.weight)[0]
            bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
            init.uniform_(self.bias, -bound, bound)

    operator = "conv2d"

    def operator_args(self, x: Tensor) -> tuple:
        x, padding = self._padded(x)
        return OPERATORS["conv2d"].check(
            x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups
        )

    def forward(self, x: Tensor) -> Tensor:
        x, padding = self._padded(x)
        return F.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)

    def _padded(self, x: Tensor) -> tuple[Tensor, Any]:
        """(the input, the convolution's padding): as given for padding_mode 'zeros';
        else the input padded by F.pad in that mode, by conv2d's own padding rule
        (``meta.conv_padding``), and no padding left to the convolution."""
        if self.padding_mode == "zeros":
            return x, self.padding
        rank = len(self.kernel_size)  # 2, or Conv1d's 1: its geometry is a row's
        ones, zeros = (1,) * (2 - rank), (0,) * (2 - rank)
        padding = self.padding if isinstance(self.padding, str) else zeros + self.padding
        top, bottom, left, right = meta.conv_padding(
            padding, ones + self.kernel_size, ones + self.stride, ones + self.dilation
        )
        flat = (left, right, top, bottom)[: 2 * rank]  # F.pad's order: the last axis first
        return F.pad(x, flat, PADDING_MODES[self.padding_mode]), (0,) * rank

    def extra_repr(self) -> str:
        text = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode}"
        return text + ("" if self.bias is not None else ", bias=False")


class Conv1d(Conv2d):
    """1-D convolution (F.conv1d); weight (out, in / groups, k), initialized as
    Conv2d's of kernel size (1, k)."""

    @checked
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int],
        stride: int | tuple[int] = 1,
        padding: int | tuple[int] | str = 0,
        dilation: int | tuple[int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        k, s, d = (_single(v) for v in (kernel_size, stride, dilation))
        pad2 = padding if isinstance(padding, str) else (0, _single(padding))
        super().__init__(
            in_channels, out_channels, (1, k), (1, s), pad2, (1, d), groups, bias,
            padding_mode, device, dtype,
        )  # fmt: skip
        self.kernel_size, self.stride, self.dilation = (k,), (s,), (d,)
        self.padding = padding if isinstance(padding, str) else (_single(padding),)
        self.weight = Parameter(ops.reshape(self.weight.detach(), (out_channels, -1, k)))

    def forward(self, x: Tensor) -> Tensor:
        x, padding = self._padded(x)
        return F.conv1d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}" + ("" if self.bias is not None else ", bias=False")
        )


# Conv1d's and Conv2d's padding modes: F.pad's mode for each (Conv2d._padded)
PADDING_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "replicate",
                 "circular": "circular"}  # fmt: skip


def _single(v: Any) -> int:
    return v[0] if isinstance(v, (tuple, list)) else v


class ConvTranspose2d(Module):
    """2-D transposed convolution (F.conv_transpose2d); weight (in, out / groups, kH,
    kW) and bias start as PyTorch's (Conv2d's rule applied to that weight)."""

    @checked
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        output_padding: int | tuple[int, int] = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: int | tuple[int, int] = 1,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        if padding_mode != "zeros":
            raise ValueError(f"{cls}: only padding_mode='zeros' is supported, got {padding_mode!r}")
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{cls}: groups={groups} must be positive and divide "
                f"in_channels={in_channels} and out_channels={out_channels}"
            )
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.output_padding = _pair(padding), _pair(output_padding)
        self.dilation, self.groups = _pair(dilation), groups
        shape = (in_channels, out_channels // groups, *self.kernel_size)
        self.weight = Parameter(_empty(shape, dtype, device))
        self.bias = Parameter(_empty((out_channels,), dtype, device)) if bias else None
        self.reset_parameters()

    reset_parameters = Conv2d.reset_parameters

    def forward(self, x: Tensor, output_size: Sequence[int] | None = None) -> Tensor:
        """``output_size``: the output's spatial size (or its whole shape), which picks
        output_padding among the sizes this stride allows (PyTorch's)."""
        return F.conv_transpose2d(
            x, self.weight, self.bias, self.stride, self.padding,
            self._output_padding(x, output_size), self.groups, self.dilation,
        )  # fmt: skip

    def _output_padding(self, x: Tensor, output_size: Sequence[int] | None) -> tuple:
        """The output_padding that gives ``output_size`` (PyTorch's ``_output_padding``):
        each spatial size between the least one, output_padding 0, and stride - 1 more."""
        if output_size is None:
            return self.output_padding
        cls, spatial = type(self).__name__, len(self.kernel_size)
        size = tuple(output_size)
        if len(size) == x.ndim:  # the whole shape: its spatial part
            size = size[-spatial:]
        if len(size) != spatial or not all(isinstance(n, numbers.Integral) for n in size):
            raise ValueError(
                f"{cls}: output_size must be {spatial} ints or the output's whole shape, "
                f"got {output_size!r}"
            )
        least = tuple(
            (n - 1) * s - 2 * p + d * (k - 1) + 1
            for n, s, p, d, k in zip(
                x.shape[-spatial:], self.stride, self.padding, self.dilation, self.kernel_size
            )
        )
        most = tuple(lo + s - 1 for lo, s in zip(least, self.stride))
        if not all(lo <= n <= hi for lo, n, hi in zip(least, size, most)):
            raise ValueError(
                f"{cls}: requested an output size of {size}, but valid sizes range from "
                f"{least} to {most} (for an input of {tuple(x.shape[-spatial:])})"
            )
        return tuple(n - lo for n, lo in zip(size, least))

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, "
            f"output_padding={self.output_padding}"
        )


class ConvTranspose1d(ConvTranspose2d):
    """1-D transposed convolution (F.conv_transpose1d); weight (in, out / groups, k),
    initialized as ConvTranspose2d's of kernel size (1, k)."""

    @checked
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int],
        stride: int | tuple[int] = 1,
        padding: int | tuple[int] = 0,
        output_padding: int | tuple[int] = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: int | tuple[int] = 1,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        k, s, p, op, d = (
            _single(v) for v in (kernel_size, stride, padding, output_padding, dilation)
        )
        super().__init__(
            in_channels, out_channels, (1, k), (1, s), (0, p), (0, op), groups, bias, (1, d),
            padding_mode, device, dtype,
        )  # fmt: skip
        self.kernel_size, self.stride, self.padding = (k,), (s,), (p,)
        self.output_padding, self.dilation = (op,), (d,)
        self.weight = Parameter(ops.reshape(self.weight.detach(), (in_channels, -1, k)))

    def forward(self, x: Tensor, output_size: Sequence[int] | None = None) -> Tensor:
        return F.conv_transpose1d(
            x, self.weight, self.bias, self.stride, self.padding,
            self._output_padding(x, output_size), self.groups, self.dilation,
        )  # fmt: skip


class Upsample(Module):
    """Resizing to ``size`` or by ``scale_factor`` (F.interpolate)."""

    def __init__(
        self,
        size: int | tuple[int, int] | None = None,
        scale_factor: float | tuple[float, float] | None = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
    ) -> None:
        super().__init__()
        self.size, self.scale_factor = size, scale_factor
        self.mode, self.align_corners = mode, align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(
            x, self.size, self.scale_factor, self.mode, self.align_corners,
            self.recompute_scale_factor,
        )  # fmt: skip

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"


class _Pad2d(Module):
    """Padding of the last two axes by (left, right, top, bottom) (F.pad)."""

    mode = "constant"

    def __init__(self, padding: int | tuple[int, int, int, int]) -> None:
        super().__init__()
        self.padding = tuple(padding) if isinstance(padding, (tuple, list)) else (padding,) * 4

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x, self.padding, self.mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad2d(_Pad2d):
    """Zeros around the last two axes (negative padding crops)."""


class ConstantPad2d(_Pad2d):
    """``value`` around the last two axes (negative padding crops)."""

    def __init__(self, padding: int | tuple[int, int, int, int], value: float) -> None:
        super().__init__(padding)
        self.value = value

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ReflectionPad2d(_Pad2d):
    """The last two axes mirrored at their edges (the edge not repeated)."""

    mode = "reflect"


class ReplicationPad2d(_Pad2d):
    """The last two axes' edge values repeated."""

    mode = "replicate"


class _BatchNorm(Module):
    """Batch normalization over every axis but the channels' (1): batch statistics in
    training (updating the running ones by ``momentum``, or their cumulative average
    when momentum is None), the running statistics in evaluation. A subclass names the
    input ranks it takes (``ranks``), as PyTorch's three, and declares its operator
    itself (Sequential fuses only what a module's own class declares: ``_operator``)."""

    ranks: tuple[int, ...]

    @checked
    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = Parameter(init.ones_(_empty((num_features,), dtype, device)))
            self.bias = Parameter(init.zeros_(_empty((num_features,), dtype, device)))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer(
                "running_mean", init.zeros_(_empty((num_features,), dtype, device))
            )
            self.register_buffer("running_var", init.ones_(_empty((num_features,), dtype, device)))
            self.register_buffer("num_batches_tracked", ops.zeros((), dtype="int64", device=device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def operator_args(self, x: Tensor) -> tuple:
        if x.ndim not in self.ranks:
            ranks = " or ".join(f"{r}-D" for r in self.ranks)
            raise ValueError(
                f"{type(self).__name__}: expected a {ranks} input, got shape {x.shape}"
            )
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)  # in place, as a compiled step replays it
            if self.momentum is None:  # the cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or self.running_mean is None
        use_running = not self.training or self.track_running_stats
        return _NATIVE_BATCH_NORM.check(
            x,
            self.weight,
            self.bias,
            self.running_mean if use_running else None,
            self.running_var if use_running else None,
            batch_stats,
            momentum,
            self.eps,
        )

    def forward(self, x: Tensor) -> Tensor:
        return _NATIVE_BATCH_NORM(*self.operator_args(x))[0]

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) or (N, C, L) inputs over N (and L)."""

    ranks = (2, 3)
    operator = _NATIVE_BATCH_NORM.name


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W) inputs over N, H and W."""

    ranks = (4,)
    operator = _NATIVE_BATCH_NORM.name


class BatchNorm3d(_BatchNorm):
    """Batch normalization of (N, C, D, H, W) inputs over N, D, H and W."""

    ranks = (5,)
    operator = _NATIVE_BATCH_NORM.name


def _affine(module: Module, shape: tuple, weight: bool, bias: bool, dtype: Any, device: Any):
    """A normalization's weight (ones) and bias (zeros) of ``shape``, each registered as
    None when absent."""
    for name, present, fill in (("weight", weight, init.ones_), ("bias", bias, init.zeros_)):
        value = Parameter(fill(_empty(shape, dtype, device))) if present else None
        module.register_parameter(name, value)


class LayerNorm(Module):
    """Layer normalization over the trailing ``normalized_shape`` axes (F.layer_norm);
    with elementwise_affine a weight (ones) and, with bias, a bias (zeros) of that
    shape."""

    @checked
    def __init__(
        self,
        normalized_shape: int | tuple[int, ...] | list[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):  # NumPy's integers too
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        _affine(
            self,
            self.normalized_shape,
            elementwise_affine,
            elementwise_affine and bias,
            dtype,
            device,
        )

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class GroupNorm(Module):
    """Group normalization of (N, C, ...) over num_groups groups of channels
    (F.group_norm); with affine a per-channel weight (ones) and bias (zeros)."""

    @checked
    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(
                f"GroupNorm: num_groups={num_groups} must be positive and divide "
                f"num_channels={num_channels}"
            )
        self.num_groups, self.num_channels = num_groups, num_channels
        self.eps, self.affine = eps, affine
        _affine(self, (num_channels,), affine, affine, dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class Embedding(Module):
    """A lookup table of num_embeddings rows of embedding_dim (F.embedding), drawn from
    N(0, 1) with the padding_idx row zeroed, as in PyTorch."""

    @checked
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(
                    f"Embedding: padding_idx must be within num_embeddings "
                    f"({num_embeddings}), got {padding_idx}"
                )
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        self.weight = Parameter(_empty((num_embeddings, embedding_dim), dtype, device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx] = 0.0

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> Embedding:
        """An Embedding whose rows are a copy of ``embeddings`` (num_embeddings,
        embedding_dim), trained unless ``freeze``; its padding_idx row is kept as given,
        as PyTorch's."""
        if embeddings.ndim != 2:
            raise ValueError(
                f"Embedding.from_pretrained: embeddings must be 2-D, got shape {embeddings.shape}"
            )
        rows, dim = embeddings.shape
        module = cls(rows, dim, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                     device=embeddings.device, dtype=embeddings.dtype)  # fmt: skip
        with no_grad():
            module.weight[...] = embeddings
        module.weight.requires_grad_(not freeze)
        return module

    def forward(self, input: Tensor) -> Tensor:
        return F.embedding(
            input,
            self.weight,
            self.padding_idx,
            self.max_norm,
            self.norm_type,
            self.scale_grad_by_freq,
            self.sparse,
        )

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        return text + ("" if self.padding_idx is None else f", padding_idx={self.padding_idx}")


class _Pool(Module):
    _fn: Callable

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size, self.padding, self.dilation = kernel_size, padding, dilation
        self.stride = kernel_size if stride is None else stride
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        fn = type(self)._fn
        return fn(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            self.ceil_mode,
            self.return_indices,
        )

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class MaxPool2d(_Pool):
    """Max pooling (F.max_pool2d)."""

    _fn = staticmethod(F.max_pool2d)


class MinPool2d(_Pool):
    """Min pooling (F.min_pool2d): seed 2's minimum pooling."""

    _fn = staticmethod(F.min_pool2d)


class AvgPool2d(Module):
    """Average pooling (F.avg_pool2d)."""

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size, self.padding = kernel_size, padding
        self.stride = kernel_size if stride is None else stride
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Average pooling to a fixed output size (F.adaptive_avg_pool2d)."""

    def __init__(self, output_size: int | tuple[int | None, int | None]) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool2d(Module):
    """Max pooling to a fixed output size, with the indices when asked
    (F.adaptive_max_pool2d)."""

    def __init__(
        self, output_size: int | tuple[int | None, int | None], return_indices: bool = False
    ) -> None:
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        return F.adaptive_max_pool2d(x, self.output_size, self.return_indices)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class LocalResponseNorm(Module):
    """Local response normalization across channels (F.local_response_norm)."""

    @checked
    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, x: Tensor) -> Tensor:
        return F.local_response_norm(x, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class ReLU(Module):
    """max(x, 0). ``inplace`` is accepted for PyTorch compatibility; lamina's relu
    always makes a new tensor."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    operator = "relu"

    def operator_args(self, x: Tensor) -> tuple:
        return (x,)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class LeakyReLU(Module):
    """x where positive, negative_slope * x elsewhere."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class GELU(Module):
    """x * Phi(x) (approximate='tanh': PyTorch's tanh approximation)."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """x * sigmoid(x). ``inplace`` is accepted for PyTorch compatibility, as ReLU's."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class Hardtanh(Module):
    """x clamped to [min_val, max_val]. ``inplace`` is accepted for PyTorch
    compatibility, as ReLU's."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        if not min_val <= max_val:
            raise ValueError(
                f"Hardtanh: min_val must not exceed max_val, got {min_val} and {max_val}"
            )
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


class ReLU6(Hardtanh):
    """min(max(x, 0), 6): Hardtanh(0, 6), as in PyTorch."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return ""


class Hardswish(Module):
    """x * relu6(x + 3) / 6. ``inplace`` is accepted for PyTorch compatibility, as
    ReLU's."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.hardswish(x)


class ELU(Module):
    """x where positive, alpha (exp(x) - 1) elsewhere (F.elu). ``inplace`` is accepted
    for PyTorch compatibility, as ReLU's."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class Softplus(Module):
    """log(1 + exp(beta x)) / beta, linear above threshold (F.softplus)."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Tensor) -> Tensor:
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class PixelShuffle(Module):
    """``(..., C r^2, H, W)`` -> ``(..., C, H r, W r)`` (F.pixel_shuffle)."""

    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return F.pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """``(..., C, H r, W r)`` -> ``(..., C r^2, H, W)`` (F.pixel_unshuffle)."""

    def __init__(self, downscale_factor: int) -> None:
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return F.pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


class Sigmoid(Module):
    """1 / (1 + exp(-x))."""

    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Tanh(Module):
    """tanh(x), elementwise."""

    def forward(self, x: Tensor) -> Tensor:
        return ops.tanh(x)


class Softmax(Module):
    """softmax along ``dim``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.dim)


class LogSoftmax(Module):
    """log_softmax along ``dim``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.log_softmax(x, self.dim)


class Dropout(Module):
    """Zeroes elements with probability p in training mode, scaling the rest by
    1 / (1 - p); the identity in evaluation mode."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Flatten(Module):
    """Merges axes start_dim..end_dim (F.flatten)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return F.flatten(x, self.start_dim, self.end_dim)


class Identity(Module):
    """Returns its input."""

    def forward(self, x: Any) -> Any:
        return x


# ---------------------------------------------------------------- losses


class CrossEntropyLoss(Module):
    """F.cross_entropy of logits and class indices (or probabilities)."""

    def __init__(
        self,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(
            input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing
        )


class NLLLoss(Module):
    """F.nll_loss of log-probabilities and class indices."""

    def __init__(
        self, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean"
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class MSELoss(Module):
    """F.mse_loss."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, self.reduction)


class BCELoss(Module):
    """F.binary_cross_entropy of probabilities, with optional element weights."""

    def __init__(self, weight: Tensor | None = None, reduction: str = "mean") -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy(input, target, self.weight, self.reduction)


class BCEWithLogitsLoss(Module):
    """F.binary_cross_entropy_with_logits, with optional element weights and weights
    of the positive class."""

    def __init__(
        self,
        weight: Tensor | None = None,
        reduction: str = "mean",
        pos_weight: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(
            input, target, self.weight, self.reduction, self.pos_weight
        )


class L1Loss(Module):
    """F.l1_loss."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.l1_loss(input, target, self.reduction)


class SmoothL1Loss(Module):
    """F.smooth_l1_loss."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__()
        self.reduction, self.beta = reduction, beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(Module):
    """F.huber_loss."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__()
        self.reduction, self.delta = reduction, delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.huber_loss(input, target, self.reduction, self.delta)


class KLDivLoss(Module):
    """F.kl_div of log-probabilities and (log-)probabilities."""

    def __init__(self, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__()
        self.reduction, self.log_target = reduction, log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.kl_div(input, target, self.reduction, self.log_target)
