"""Everyday PyTorch idioms, each one expression that runs unchanged with ``m`` bound to
``torch`` or to ``lamina`` (Note [Two spellings] in dispatch/pytorch.py).

``tests/data/record_pytorch_idioms.py`` records PyTorch's results of every idiom into
``tests/data/pytorch_idioms.json``; ``tests/test_pytorch_idioms.py`` compares lamina's
with that record (and with a live PyTorch when one is installed).

In scope: ``x`` a 3x4 float32 tensor of distinct values, ``y`` one of the same shape,
``v`` a float32 vector of 4, ``i`` an int64 index tensor, ``b`` a boolean mask of x's
shape, ``n`` an int64 vector.
"""

import numpy as np

X = (np.arange(12) * 5 % 12 - 5.5).reshape(3, 4).astype(np.float32) / 2
Y = (np.arange(12) * 7 % 12 + 0.25).reshape(3, 4).astype(np.float32)
V = np.array([1.5, -2.0, 0.25, 3.0], dtype=np.float32)
IDX = np.array([[0, 3], [2, 1], [1, 1]], dtype=np.int64)
B = X > 0
N = np.array([3, 1, 2, 0, 4], dtype=np.int64)


def scope(m):
    """The names an idiom sees, as tensors of library ``m``."""
    t = m.from_numpy
    return {"m": m, "x": t(X.copy()), "y": t(Y.copy()), "v": t(V.copy()), "i": t(IDX.copy()),
            "b": t(B.copy()), "n": t(N.copy())}  # fmt: skip


IDIOMS = """
x.view(4, 3)
x.view(-1)
x.view(2, -1)
x.view_as(y.t().contiguous())
x.reshape(2, 6)
x.reshape((6, 2))
x.reshape_as(y)
x.flatten()
x.unsqueeze(0).flatten(1)
x.unsqueeze(1).shape
x.unsqueeze(-1).squeeze(-1)
x.unsqueeze(0).squeeze()
x.squeeze(0)
x.permute(1, 0)
x.transpose(0, 1)
x.t()
x.T
x.contiguous()
x.t().contiguous().is_contiguous()
x.t().is_contiguous()
x.expand(2, 3, 4)
v.expand(3, -1)
v.expand_as(x)
x.repeat(2, 1)
x.flip(0)
x.chunk(2, dim=1)
x.split(2, dim=1)
x.split([1, 3], dim=1)
x.unbind(0)
x.narrow(1, 1, 2)
x.size()
x.size(1)
x.size(-1)
x.shape
x.numel()
x.dim()
x.ndim
x.nelement()
x.stride()
x.element_size()
x.is_floating_point()
x.clone()
x.detach()
x.data
x.sum()
x.sum(dim=1)
x.sum(1)
x.sum(dim=(0, 1))
x.sum(dim=1, keepdim=True)
x.mean()
x.mean(dim=0)
x.mean(0, keepdim=True)
x.prod(dim=1)
x.std()
x.std(dim=1)
x.std(dim=0, unbiased=False)
x.var()
x.var(1, keepdim=True)
x.max()
x.max(dim=1)
x.max(1, keepdim=True)
x.max(dim=1)[0]
x.max(dim=1).indices
x.min(dim=0)
x.min()
x.amax(dim=1)
x.amin(dim=0)
x.argmax()
x.argmax(dim=1)
x.argmax(dim=1, keepdim=True)
x.argmin(dim=0)
x.sort(dim=1)
x.sort(dim=0, descending=True)
x.argsort(dim=1)
x.topk(2)
x.topk(2, dim=0, largest=False)
x.cumsum(dim=1)
x.cumprod(0)
x.norm()
x.norm(dim=1)
x.norm(p=1, dim=0)
x.logsumexp(dim=1)
(x > 0).all()
(x > 0).any(dim=1)
x.abs()
x.neg()
x.exp()
x.sqrt().isnan()
x.abs().sqrt()
x.abs().rsqrt()
x.sigmoid()
x.tanh()
x.relu()
x.softmax(dim=1)
x.log_softmax(dim=0)
x.pow(2)
x ** 2
x.clamp(-1, 1)
x.clamp(min=0)
x.clamp(max=0.5)
x.clamp_min(0.0)
x.clip(-0.5, 0.5)
x.floor()
x.ceil()
x.round()
x.sign()
x.reciprocal()
x.add(y)
x.add(y, alpha=2)
x.sub(y)
x.mul(y)
x.mul(2)
x.div(y)
x.div(2)
x.div(y, rounding_mode="floor")
x.div(y, rounding_mode="trunc")
x.eq(y)
x.eq(x)
x.ne(y)
x.lt(y)
x.le(0)
x.gt(0)
x.ge(y)
x.maximum(y)
x.minimum(y)
x.eq(x).sum().item()
(x.argmax(dim=1) == n[:3]).float().mean()
x.argmax(dim=1).eq(n[:3].view_as(x.argmax(dim=1))).sum().item()
x.where(b, y)
x.masked_fill(b, 0.0)
x.masked_fill(~b, -1.0)
x.lerp(y, 0.25)
x.matmul(y.t())
x.mm(y.t())
x @ y.t()
v.dot(v)
x.mv(v)
v.outer(v)
x.gather(1, i)
x.gather(1, i[:2])
x.max(y)
x.min(y)
x.index_select(1, n[:2])
x.index_select(0, n[1:3])
x.masked_select(b)
x.nonzero()
b.nonzero()
x.new_zeros(2, 3)
x.new_ones((2,))
x.new_full((2, 2), 7.0)
x.new_tensor([1, 2])
x.float()
x.double()
x.long()
x.int()
x.bool()
x.to(m.float64)
x.to(dtype=m.int32)
x.to("cpu")
x.to(y)
x.type_as(n)
x.cpu()
x.item() if x.numel() == 1 else x[0, 0].item()
x[1].tolist()
x.tolist()
x[0]
x[:, 1]
x[b]
x[i[:, 0]]
x[..., -1]
x[None].shape
m.zeros(2, 3)
m.zeros((2, 3))
m.ones(4)
m.ones(2, 2, dtype=m.int64)
m.full((2, 2), 3.5)
m.arange(5)
m.arange(0, 1, 0.25)
m.linspace(0, 1, 5)
m.eye(3)
m.zeros_like(x)
m.ones_like(x)
m.full_like(x, 2)
m.tensor([1.0, 2.0])
m.tensor([[1, 2], [3, 4]])
m.tensor(3.5)
m.tensor([True, False])
m.tensor([1.0, 2.0], dtype=m.float64)
m.from_numpy(__import__("numpy").ones(3))
m.as_tensor([1, 2, 3])
m.cat([x, y])
m.cat([x, y], dim=1)
m.cat((x, y), 1)
m.stack([x, y])
m.stack([x, y], dim=2)
m.flatten(x)
m.flatten(x.unsqueeze(0), 1)
m.transpose(x, 0, 1)
m.unsqueeze(x, 0)
m.permute(x, (1, 0))
m.sum(x, dim=1)
m.sum(x, dim=1, keepdim=True)
m.mean(x, dim=0)
m.max(x)
m.max(x, dim=1)
m.max(x, y)
m.min(x, dim=0)
m.argmax(x, dim=1)
m.std(x, dim=1)
m.var(x, dim=0, unbiased=False)
m.sort(x, dim=1)
m.topk(x, 2)
m.clamp(x, -1, 1)
m.where(b, x, y)
m.where(b, x, 0.0)
m.exp(x)
m.log(x.abs())
m.sqrt(x.abs())
m.abs(x)
m.sigmoid(x)
m.tanh(x)
m.relu(x)
m.softmax(x, dim=1)
m.log_softmax(x, dim=1)
m.matmul(x, y.t())
m.mm(x, y.t())
m.bmm(x.unsqueeze(0), y.t().unsqueeze(0))
m.cumsum(x, dim=0)
m.gather(x, 1, i)
m.index_select(x, 0, n[1:3])
m.masked_fill(x, b, 0.0)
m.numel(x)
m.is_tensor(x)
m.is_tensor(3)
m.chunk(x, 2)
m.split(x, 2, dim=1)
m.unbind(x, dim=1)
m.logsumexp(x, dim=1)
m.norm(x)
m.amax(x, dim=0)
m.eq(x, y)
m.allclose(x, x)
m.isclose(x, y)
m.allclose(x, x + 1e-7)
m.isnan(x)
m.float32
m.float
m.long
m.int64
m.get_default_dtype()
m.randn(2, 3).dtype
m.rand(4).shape
m.zeros(3).dtype
m.arange(3).dtype
m.randint(0, 5, (3,)).dtype
m.randperm(4).dtype
m.randperm(6).sort().values
m.device("cpu").type
m.cuda.is_available()
m.tensor([1.5]).float().dtype
m.ones(2, 2).sum(dim=0).tolist()
""".strip().splitlines()


def encode(result):
    """A result as JSON-able data that reads alike for both libraries."""
    import numpy as np

    kind = type(result).__name__
    if kind == "Tensor":
        values = np.asarray(result.detach().cpu().numpy() if hasattr(result, "cpu") else result)
        return {
            "tensor": str(result.dtype).removeprefix("torch.").removeprefix("lamina."),
            "shape": list(result.shape),
            "values": values.ravel().tolist(),
        }
    if isinstance(result, (bool, int, float, str)) or result is None:
        return {"scalar": result, "type": type(result).__name__}
    if isinstance(result, (tuple, list)):
        return {"seq": [encode(r) for r in result]}
    if kind in ("dtype", "DType"):
        return {"dtype": str(result).removeprefix("torch.").removeprefix("lamina.")}
    raise TypeError(f"cannot encode a {kind}")
