"""The scatter-add embedding (kernels/embedding.py) against torch's embedding: values, the
weight gradient with repeated indices, fp64 gradcheck, and the options it refuses. On
kernel_device (tests/conftest.py): on CUDA the index_add_ is atomic adds, the path the engine runs."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.embedding import EmbeddingFunction, ScatterEmbedding

pytestmark = pytest.mark.kernels


@pytest.mark.parametrize("shape", [(3, 7), (1, 1), (5, 33)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_embedding_with_repeated_indices(shape, dtype, kernel_device):
    dev = kernel_device
    g = torch.Generator().manual_seed(0)
    V, C = 11, 13  # odd sizes; more rows than symbols, so indices repeat and their rows must add up
    idx = torch.randint(0, V, shape, generator=g)
    idx.view(-1)[0] = idx.view(-1)[-1]
    w = torch.randn(V, C, generator=g).to(dtype)
    dy = torch.randn(*shape, C, generator=g).to(dtype)
    w1, w2 = w.to(dev, copy=True).requires_grad_(), w.to(dev, copy=True).requires_grad_()
    y1, y2 = EmbeddingFunction.apply(idx.to(dev), w1), F.embedding(idx.to(dev), w2)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    y1.backward(dy.to(dev))
    y2.backward(dy.to(dev))
    assert w1.grad.dtype == dtype and w1.grad.device == w1.device
    # The exact sum (fp64), rounded once to the dtype: the fp32 accumulation lands within an ulp.
    exact = torch.zeros(V, C, dtype=torch.float64).index_add_(0, idx.reshape(-1), dy.double().reshape(-1, C))
    torch.testing.assert_close(w1.grad.cpu().double(), exact.to(dtype).double(), rtol=2 ** -7
                               if dtype != torch.float32 else 1e-6, atol=1e-6)
    if dtype == torch.float32:
        torch.testing.assert_close(w1.grad, w2.grad)


def test_gradcheck_fp64(kernel_device):
    idx = torch.tensor([[0, 2, 2], [1, 0, 4]], device=kernel_device)
    w = torch.randn(5, 3, dtype=torch.float64, device=kernel_device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: EmbeddingFunction.apply(idx, w), (w,))


def test_module_shares_the_parameter_and_refuses_other_options(kernel_device):
    emb = nn.Embedding(7, 4).to(kernel_device)
    m = ScatterEmbedding(emb)
    assert m.weight is emb.weight and "7, 4" in repr(m)
    idx = torch.tensor([[1, 6, 1]], device=kernel_device)
    torch.testing.assert_close(m(idx), emb(idx))
    for kw in (dict(padding_idx=0), dict(max_norm=1.0), dict(scale_grad_by_freq=True), dict(sparse=True)):
        with pytest.raises(ValueError, match="plain embeddings"):
            ScatterEmbedding(nn.Embedding(7, 4, **kw))
