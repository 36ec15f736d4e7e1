"""ftlib.model.reference (the kernels' plain-PyTorch definitions) and the triton-less import of kernels."""

import math
import subprocess
import sys

import torch
import torch.nn.functional as F

from ftlib.model import reference


def test_reexports_are_the_model_implementations():
    from ftlib.model.attention import causal_attention_ref
    from ftlib.model.norm import layer_norm_ref, rms_norm_ref

    assert reference.rms_norm_ref is rms_norm_ref
    assert reference.layer_norm_ref is layer_norm_ref
    assert reference.causal_attention_ref is causal_attention_ref


def test_gelu_tanh_and_epilogue():
    h = torch.randn(5, 12, dtype=torch.float64)
    b = torch.randn(12, dtype=torch.float64)
    torch.testing.assert_close(reference.gelu_tanh_ref(h), F.gelu(h, approximate="tanh"))
    torch.testing.assert_close(reference.mlp_epilogue_ref(h, b), reference.gelu_tanh_ref(h + b))
    hb = h.to(torch.bfloat16)
    out = reference.mlp_epilogue_ref(hb)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.gelu(hb.float(), approximate="tanh"), atol=1e-2, rtol=1e-2)
    # the tanh form differs from the exact erf GELU: a mix-up would be caught
    assert (reference.gelu_tanh_ref(h) - F.gelu(h)).abs().max() > 1e-5


def test_cross_entropy_ref_is_mean_with_ignore():
    z = torch.randn(6, 65, dtype=torch.float64)
    t = torch.randint(0, 65, (6,))
    t[2] = -100
    rows = torch.logsumexp(z, -1) - z.gather(1, t.clamp(min=0)[:, None]).squeeze(1)
    want = rows[t != -100].sum() / 5
    torch.testing.assert_close(reference.cross_entropy_ref(z, t), want)
    assert reference.cross_entropy_ref(z.half(), t).dtype == torch.float32


def test_adamw_ref_first_step_is_sign_like():
    """Step 1 of Adam moves every coordinate by ~lr * sign(g) (bias correction undoes (1-beta))."""
    p = torch.zeros(10)
    g = torch.linspace(-1, 1, 10) + 0.05
    reference.adamw_step_ref(p, g, torch.zeros(10), torch.zeros(10), step=1, lr=1e-2, weight_decay=0.0)
    torch.testing.assert_close(p, -1e-2 * torch.sign(g), atol=1e-8, rtol=1e-6)
    assert math.isclose(p.abs().max().item(), 1e-2, rel_tol=1e-5)


def test_kernels_import_without_triton():
    code = "import sys; sys.modules['triton'] = None; import kernels; print(kernels.HAS_TRITON)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
