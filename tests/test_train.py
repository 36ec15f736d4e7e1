"""The shared training step and optimizer groups."""

import pytest
import torch

from ftlib import build_model
from ftlib.core.precision import precision_region as precision
from ftlib.training.data import synthetic_batch
from ftlib.training.step import make_optimizer, param_groups, train_step


def test_train_step_reduces_loss_on_a_fixed_batch():
    m = build_model("fasttransformer", seed=0, n_layer=1)
    opt = make_optimizer(m, lr=3e-3)
    x, y = synthetic_batch(65, 4, 32, generator=torch.Generator().manual_seed(0))
    losses = [train_step(m, opt, x, y, grad_clip=1.0).item() for _ in range(15)]
    assert losses[-1] < losses[0] - 0.5
    assert all(torch.isfinite(torch.tensor(losses)))


def test_train_step_is_deterministic():
    def run():
        m = build_model("gpt2", seed=0, n_layer=1)
        opt = make_optimizer(m)
        x, y = synthetic_batch(65, 2, 16, generator=torch.Generator().manual_seed(1))
        return [train_step(m, opt, x, y).item() for _ in range(3)]

    assert run() == run()


def test_grad_clip_applies():
    m = build_model("gpt2", seed=0, n_layer=1)
    opt = make_optimizer(m, lr=0.0)
    x, y = synthetic_batch(65, 2, 16, generator=torch.Generator().manual_seed(1))
    train_step(m, opt, x, y, grad_clip=1e-3)
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in m.parameters()))
    assert norm.item() == pytest.approx(1e-3, rel=1e-3)


def test_param_groups_decay_matrices_only():
    m = build_model("gpt2", n_layer=1)
    decay, no_decay = param_groups(m, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == m.num_params()
    with pytest.raises(ValueError, match="scheme 'odd'"):
        param_groups(m, 0.1, "odd")


def test_precision_restores_globals():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    with precision("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "high"
    assert (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()) == before
    with precision("bf16"):
        assert torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="precision 'fp8'"):
        with precision("fp8"):
            pass


def test_provenance_fields():
    from ftlib.harness.provenance import provenance

    p = provenance("cpu")
    assert p["device_type"] == "cpu" and p["date"].endswith("Z")
    assert p["commit"] and p["run_id"] and p["machine_id"]
