"""The attention kernels' tiles: chosen per kernel from the device's shared memory, a fallback when
a GPU still refuses them, and a clear error when nothing fits (CPU interpreter)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton` (see kernels/README.md)

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from triton.runtime.errors import OutOfResources  # noqa: E402

from ftlib.model.reference import causal_attention_ref  # noqa: E402
from kernels import attention as A  # noqa: E402
from kernels import limits as LIM  # noqa: E402
from kernels import tiles as TL  # noqa: E402
from kernels._common import interpreter_ready  # noqa: E402
from kernels.limits import ENV_CAPABILITY, Limits  # noqa: E402
from kernels.tiles import SharedMemoryError, Tiles, candidate_tiles, choose_tiles, smem_estimate  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_ready(), reason="triton imported before TRITON_INTERPRET=1")
T4, A100, H100 = (Limits.for_capability(c) for c in ("7.5", "8.0", "9.0"))


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.delenv(ENV_CAPABILITY, raising=False)
    monkeypatch.setattr(TL, "_CHOSEN", {})
    monkeypatch.setattr(LIM, "_CACHE", {})


def test_candidates_shrink_to_short_sequences():
    assert candidate_tiles(256)[0] == Tiles(64, 64, 4, 2)
    assert candidate_tiles(16) == (Tiles(16, 16, 4, 2),)
    assert all(t.block_m <= 32 and t.block_n <= 32 for t in candidate_tiles(20))
    with pytest.raises(ValueError, match="power of two"):
        Tiles(48, 64)


def test_no_limit_takes_the_preferred_tiles():
    assert choose_tiles("bwd_dkdv", 128, torch.float32, 4096, None) == Tiles(64, 64)
    assert choose_tiles("bwd_dkdv", 128, torch.float32, 4096, Limits("unknown", (9, 0), None)) == Tiles(64, 64)


def test_t4_gets_smaller_dkdv_tiles_in_fp32_at_head_size_64():
    # The fp32 dK/dV kernel at 64 x 64 needs ~80 KB on sm_75 (tests/test_aot.py compiles it);
    # a T4 allows 64 KB per block. The forward keeps 64 x 64.
    dkdv = choose_tiles("bwd_dkdv", 64, torch.float32, 256, T4)
    assert (dkdv.block_m, dkdv.block_n) != (64, 64)
    assert smem_estimate("bwd_dkdv", 64, torch.float32, dkdv, 75) <= T4.smem_per_block
    assert smem_estimate("bwd_dkdv", 64, torch.float32, Tiles(64, 64), 75) > T4.smem_per_block
    assert choose_tiles("fwd", 64, torch.float32, 256, T4) == Tiles(64, 64)
    for info in (A100, H100):  # bigger cards keep the measured default everywhere
        assert all(choose_tiles(k, 64, torch.float32, 256, info) == Tiles(64, 64) for k in TL.ATTN_KERNELS)


def test_nothing_fits_names_the_kernel_its_need_and_the_limit():
    tiny = Limits(name="tiny", capability=(7, 5), smem_per_block=4096)
    with pytest.raises(SharedMemoryError, match=r"'bwd_dkdv' needs \d+ bytes .* the device allows 4096 .*tiny") as e:
        choose_tiles("bwd_dkdv", 128, torch.float32, 256, tiny)
    assert e.value.kernel == "bwd_dkdv" and e.value.limit == 4096 and e.value.needed > 4096
    with pytest.raises(ValueError, match="unknown attention kernel"):
        smem_estimate("bwd", 64, torch.float32, Tiles(64, 64))


def test_a_gpu_refusal_falls_back_to_the_next_tiles_and_is_remembered():
    tried = []

    def launch(t):
        tried.append(t)
        if t.block_n == 64:
            raise OutOfResources(81920, 65536, "shared memory")
        return "ran"

    key = ("bwd_dkdv", "cuda:0")
    order = list(candidate_tiles(256))
    assert TL.launch_tiled("bwd_dkdv", launch, order, key) == "ran"
    assert tried == [Tiles(64, 64), Tiles(64, 32)] and TL._CHOSEN[key] == Tiles(64, 32)
    with pytest.raises(SharedMemoryError, match=r"needs 81920 bytes .* allows 65536 .*tried 64x64/s2"):
        TL.launch_tiled("bwd_dkdv", launch, [Tiles(64, 64)], None)
    with pytest.raises(OutOfResources):  # not shared memory: not ours to handle
        TL.launch_tiled("fwd", lambda t: (_ for _ in ()).throw(OutOfResources(2048, 1024, "threads")), order, None)


def test_rehearsed_t4_tiles_compute_the_same_attention(monkeypatch):
    monkeypatch.setenv(ENV_CAPABILITY, "7.5")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 70, 64, generator=g, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 2, 70, 64, generator=g)
    o = A.flash_attention(q, k, v)  # tiles chosen for a T4's 64 KB
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    qr, kr, vr = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = causal_attention_ref(qr, kr, vr)
    refs = (ref, *torch.autograd.grad(ref, (qr, kr, vr), do.double()))
    for got, want in zip((o, dq, dk, dv), refs):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    chosen = {key[1]: t for key, t in TL._CHOSEN.items() if key[0] == "flash"}  # key: (family, kernel, ...)
    assert chosen["fwd"] == Tiles(64, 64) and (chosen["bwd_dkdv"].block_m, chosen["bwd_dkdv"].block_n) != (64, 64)


def test_each_family_of_kernels_keeps_its_own_choice(monkeypatch):
    """The explicit-attention kernels choose and cache their tiles apart from the flash kernels of the same
    role: a choice one made (here a fallback forced on the flash forward) is not the other's."""
    from kernels.explicit_attention import explicit_attention_fwd

    q, k, v = (torch.randn(1, 2, 40, 32) for _ in range(3))
    key_flash, _ = TL.tiles_to_try("fwd", 32, torch.float32, 40, q.device, None)
    TL._CHOSEN[key_flash] = Tiles(32, 16)  # as if the flash forward had fallen back
    explicit_attention_fwd(q, k, v)
    chosen = {key[:2]: t for key, t in TL._CHOSEN.items()}
    assert chosen[("flash", "fwd")] == Tiles(32, 16) and chosen[("explicit", "fwd")] == Tiles(64, 64)
