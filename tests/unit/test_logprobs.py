"""Chunked per-token log-probs and entropies against the materialised log-softmax.

Shapes: b = samples, t = tokens, v = vocab.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlpost.algos import entropy_from_logits
from rlpost.trainers.logprobs import token_logprobs, token_logprobs_and_entropy


def reference(
    logits_btv: torch.Tensor, ids_bt: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the trainer computed before: a [b, t, v] log-softmax and softmax, in float32
    (or in float64 for float64 logits)."""
    z_btv = (logits_btv if logits_btv.dtype == torch.float64 else logits_btv.float()) / temperature
    z_btv = z_btv.clamp(min=torch.finfo(z_btv.dtype).min)  # a lowest logit / T stays finite
    logp_btv = F.log_softmax(z_btv[:, :-1], dim=-1)
    logp_bt = F.pad(logp_btv.gather(-1, ids_bt[:, 1:, None])[..., 0], (1, 0))
    return logp_bt, F.pad(entropy_from_logits(z_btv[:, :-1]), (1, 0))


def test_hand_values():
    # v = 2; logits are logs of unnormalised weights, so p = weight / sum:
    # t=0 weights (1, 3) -> p(1) = 3/4; t=1 weights (3, 1) -> p(0) = 3/4
    # ids (0, 1, 0): logp = (0, ln 0.75, ln 0.75) = (0, -0.2877, -0.2877)
    # entropy of (1/4, 3/4) = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.3466 + 0.2158 = 0.5623
    logits = torch.tensor([[[1.0, 3.0], [3.0, 1.0], [5.0, 5.0]]]).log()
    ids = torch.tensor([[0, 1, 0]])
    logp, entropy = token_logprobs_and_entropy(logits, ids, plain_elements=0)
    torch.testing.assert_close(logp, torch.tensor([[0.0, -0.28768207, -0.28768207]]))
    torch.testing.assert_close(entropy, torch.tensor([[0.0, 0.56233514, 0.56233514]]))
    # temperature 2 halves the logits: weights (1, sqrt 3) -> p(1) = 1.732 / 2.732 = 0.634
    logp_t2 = token_logprobs(logits, ids, temperature=2.0)
    assert logp_t2[0, 1].item() == pytest.approx(float(torch.tensor(0.6339746).log()), abs=1e-6)


def _grad(fn, logits: torch.Tensor, w_logp: torch.Tensor, w_ent: torch.Tensor) -> torch.Tensor:
    """d/dlogits of sum(w_logp * logp + w_ent * entropy), as the policy loss with an
    entropy bonus weighs them."""
    x = logits.detach().clone().requires_grad_()
    logp, entropy = fn(x)
    ((logp * w_logp.to(logp.dtype)).sum() + (entropy * w_ent.to(entropy.dtype)).sum()).backward()
    assert x.grad is not None
    return x.grad


@pytest.mark.parametrize("chunk_elements", [1, 2 * 11, 1 << 23])  # 1 token, 2 tokens, all
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_the_materialised_log_softmax(chunk_elements, temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g) * 3
    ids = torch.randint(0, 11, (3, 7), generator=g)
    w_logp, w_ent = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    no_ent = torch.zeros(3, 7)

    def chunked(x):
        return token_logprobs_and_entropy(x, ids, temperature, True, chunk_elements, 0)

    def old(x):
        return reference(x, ids, temperature)

    logp, entropy = chunked(logits)
    old_logp, old_entropy = old(logits)
    truth_logp, truth_entropy = old(logits.double())
    # float32 rounding: a log-prob near -9 is 1 ulp = 9.5e-7 from its neighbours, so
    # the comparison allows 1e-6 plus 1e-6 of the value
    torch.testing.assert_close(logp, old_logp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(logp.double(), truth_logp, rtol=0, atol=1e-6)
    # entropy within 1e-6 of float64; the old lse - sum(p z) cancels digits (an entropy
    # of 0.0792 came out 1.2e-6 high), hence 2e-6 against it
    torch.testing.assert_close(entropy.double(), truth_entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy, old_entropy, rtol=0, atol=2e-6)
    assert torch.all(logp[:, 0] == 0) and torch.all(entropy[:, 0] == 0)

    # the policy-gradient term alone: the old implementation's gradient to 1e-6
    grad = _grad(chunked, logits, w_logp, no_ent)
    torch.testing.assert_close(grad, _grad(old, logits, w_logp, no_ent), rtol=1e-6, atol=1e-6)
    # with the entropy term: within 1e-6 of float64; the old float32 chain of logsumexp
    # and softmax backward is itself up to 1.6e-6 off at T = 0.7, hence 2e-6 against it
    grad = _grad(chunked, logits, w_logp, w_ent)
    truth = _grad(old, logits.double(), w_logp, w_ent)
    torch.testing.assert_close(grad.double(), truth, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad, _grad(old, logits, w_logp, w_ent), rtol=0, atol=2e-6)
    # the last position predicts no token: no gradient reaches its logits
    assert torch.all(grad[:, -1] == 0)


def test_log_probs_alone_skip_the_entropy():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 13, generator=g).requires_grad_()
    ids = torch.randint(0, 13, (2, 5), generator=g)
    logp, entropy = token_logprobs_and_entropy(logits, ids, with_entropy=False, plain_elements=0)
    assert torch.all(entropy == 0) and not entropy.requires_grad
    logp.sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    reference(logits, ids, 1.0)[0].sum().backward()
    torch.testing.assert_close(grad, logits.grad, rtol=0, atol=1e-6)


def test_bf16_logits_get_a_bf16_gradient_of_the_float32_math():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 6, 17, generator=g).bfloat16().requires_grad_()
    ids = torch.randint(0, 17, (2, 6), generator=g)
    logp, entropy = token_logprobs_and_entropy(logits, ids, plain_elements=0)
    assert logp.dtype == entropy.dtype == torch.float32
    (logp.sum() + entropy.sum()).backward()
    grad = logits.grad.clone()
    logits.grad = None
    ref_logp, ref_entropy = reference(logits, ids, 1.0)
    (ref_logp.sum() + ref_entropy.sum()).backward()
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-6)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad, logits.grad, rtol=0, atol=0)


def test_masked_out_logits_give_a_finite_entropy():
    # -inf on token 2 of 3: the distribution is uniform over the other two, H = ln 2 = 0.6931
    logits = torch.tensor([[[0.0, 0.0, float("-inf")], [0.0, 0.0, 0.0]]])
    logp, entropy = token_logprobs_and_entropy(logits, torch.tensor([[0, 1]]), plain_elements=0)
    assert entropy[0, 1].item() == pytest.approx(0.6931472, abs=1e-6)
    assert logp[0, 1].item() == pytest.approx(-0.6931472, abs=1e-6)


def _hidden_case(seed: int, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(3, 7, 5, generator=g) * 2).to(dtype)
    weight = torch.randn(11, 5, generator=g).to(dtype)
    ids = torch.randint(0, 9, (3, 7), generator=g)  # 9 and 10: never sampled
    return hidden, weight, ids, torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)


def _hidden_grads(fn, hidden, weight, w_logp, w_ent):
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    logp, entropy = fn(h, w)
    ((logp * w_logp).sum() + (entropy * w_ent).sum()).backward()
    return logp.detach(), entropy.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk", [1, 4, 64])  # a token a chunk, ragged chunks, all at once
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("never", [(), (9, 10)])
def test_hidden_states_give_the_logits_values_and_gradients(chunk, temperature, never):
    """The output layer folded in: the same log-probs, entropies and gradients (to the
    hidden states and to the weight) as the logits ``F.linear(h, W)`` taken whole,
    with the never-sampled tokens' logits at the lowest value as the engine sets them."""
    from rlpost.trainers.logprobs import hidden_token_stats

    hidden, weight, ids, w_logp, w_ent = _hidden_case(3)

    def fused(h, w):
        return hidden_token_stats(h, w, ids, temperature, True, never, chunk, plain_elements=0)

    def whole(h, w):
        # tokens that are never sampled have p = 0: the softmax over the other tokens
        # (a lowest logit in the reference itself turns its backward into NaN)
        return reference(F.linear(h, w[: 11 - len(never)]), ids, temperature)

    got, want = (_hidden_grads(f, hidden, weight, w_logp, w_ent) for f in (fused, whole))
    # float32 sums over the vocabulary in another order (logits of magnitude ~5):
    # within 2e-5 of gradients of magnitude ~1 (the order, and so the last bits,
    # follows the CPU's vector width: 1.1e-5 apart on some machines)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5)
    if never:  # no gradient reaches the rows of the weight the tokens never sampled use
        assert torch.all(got[3][list(never)] == 0)
    assert torch.all(got[0][:, 0] == 0) and torch.all(got[1][:, 0] == 0)


def test_hidden_states_in_bf16_match_bf16_logits():
    """bf16 hidden states and weight: each chunk's bf16 logits are the whole product's
    rows, so log-probs match exactly what the logits path computes; the weight's
    gradient sums chunks in float32 (within a bf16 rounding of the whole product's)."""
    from rlpost.trainers.logprobs import hidden_token_stats

    hidden, weight, ids, w_logp, w_ent = _hidden_case(4, torch.bfloat16)

    def fused(h, w):
        return hidden_token_stats(h, w, ids, 1.0, True, (), 4, plain_elements=0)

    def whole(h, w):
        return token_logprobs_and_entropy(F.linear(h, w), ids, 1.0, True, 1 << 20, 0)

    (lp, ent, gh, gw), (lp2, ent2, gh2, gw2) = (
        _hidden_grads(f, hidden, weight, w_logp, w_ent) for f in (fused, whole)
    )
    torch.testing.assert_close(lp, lp2, rtol=0, atol=0)
    torch.testing.assert_close(ent, ent2, rtol=0, atol=0)
    assert gh.dtype == gw.dtype == torch.bfloat16
    torch.testing.assert_close(gh, gh2, rtol=0, atol=0)
    # a bf16 rounding of each chunk's partial sum: within 2^-7 of the largest entry
    scale = float(gw2.float().abs().max())
    torch.testing.assert_close(gw.float(), gw2.float(), rtol=0, atol=2**-7 * scale)


def test_small_hidden_batches_take_the_plain_path_of_the_whole_logits():
    """Below ``plain_elements`` the logits are made whole, by the output layer's own
    ``F.linear``: the built-in models' numbers do not move."""
    from rlpost.trainers.logprobs import hidden_token_stats

    hidden, weight, ids, _, _ = _hidden_case(5)
    got = hidden_token_stats(hidden, weight, ids)
    want = token_logprobs_and_entropy(F.linear(hidden, weight), ids)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_chunks_follow_the_devices_workspace():
    from rlpost.trainers.logprobs import chunk_tokens

    # CPU: 32 MiB over 8 bytes a logit at a 151,936 vocabulary = 27 tokens (as before);
    # an accelerator's GiB over 10 bytes a logit (a bf16 chunk of logits too) = 706
    assert chunk_tokens(151_936, "cpu") == (32 << 20) // (8 * 151_936) == 27
    assert chunk_tokens(151_936, "cuda", 10) == (1 << 30) // (10 * 151_936) == 706
    assert chunk_tokens(10**12, "cpu") == 1  # never zero


@pytest.mark.parametrize("path", ["logits", "hidden", "plain"])
def test_needed_tokens_alone_are_computed_the_rest_is_zero(path):
    """With ``needed_bt`` (a policy update's response tokens), the needed tokens keep
    the values and gradients of the whole computation, and every other token is 0
    with no gradient, as a loss masked by ``needed_bt`` would weigh them."""
    from rlpost.trainers.logprobs import hidden_token_stats

    hidden, weight, ids, w_logp, w_ent = _hidden_case(6)
    # row 0: a prompt of 3 then 4 response tokens; row 1: 2 + 3, then 2 of padding;
    # row 2: no response at all (a padding row)
    needed = torch.zeros(3, 7, dtype=torch.bool)
    needed[0, 3:] = True
    needed[1, 2:5] = True
    plain = 0 if path != "plain" else 1 << 20

    def run(h, w, needed_bt):
        if path == "hidden":
            return hidden_token_stats(h, w, ids, 0.7, True, (), 2, plain, needed_bt=needed_bt)
        return token_logprobs_and_entropy(F.linear(h, w), ids, 0.7, True, 2 * 11, plain, needed_bt)

    lp, ent, gh, gw = _hidden_grads(lambda h, w: run(h, w, needed), hidden, weight, w_logp, w_ent)
    # the whole computation, its loss weighed by the mask: the same gradients
    lp_all, ent_all, gh_all, gw_all = _hidden_grads(
        lambda h, w: run(h, w, None), hidden, weight, w_logp * needed, w_ent * needed
    )
    assert torch.equal(lp, torch.where(needed, lp_all, 0.0))
    assert torch.equal(ent, torch.where(needed, ent_all, 0.0))
    torch.testing.assert_close(gh, gh_all, rtol=0, atol=1e-6)
    torch.testing.assert_close(gw, gw_all, rtol=0, atol=1e-6)
    # position t's log-prob comes from the hidden state at t - 1: row 2 (nothing
    # needed), row 1 past its last needed token (positions 4..6) and each row's
    # last position get no gradient; row 0's prompt positions 0..1 none either
    assert torch.all(gh[2] == 0) and torch.all(gh[1, 4:] == 0) and torch.all(gh[0, :2] == 0)
    assert torch.all(gh[0, 2:6].abs().sum(-1) > 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compiled_kernels_compute_what_the_eager_ones_do(dtype, device):
    """``trainer.compile``'s chunk kernels (one fused expression each way, compiled)
    against the eager ones: the output layer folded in, with never-sampled tokens,
    needed rows, a temperature and an entropy term in the loss; then the logits path
    with a -inf logit and log-probs alone. Chunks of 4 rows leave a ragged last
    chunk, and a second batch of another length compiles nothing new. On CUDA the
    compiled kernels are Triton's, on the CPU C++."""
    from torch._dynamo.utils import counters

    from rlpost.trainers.logprobs import hidden_token_stats

    hidden, weight, ids, w_logp, w_ent = (x.to(device) for x in _hidden_case(7, dtype))
    needed = torch.ones(3, 7, dtype=torch.bool)
    needed[0, :3] = False  # a prompt
    needed[2] = False  # a padding row

    def folded(compiled):
        return lambda h, w: hidden_token_stats(
            h, w, ids, 0.7, True, (9, 10), 4, 0, needed, compiled=compiled
        )

    eager, fused = (
        [x.cpu() for x in _hidden_grads(folded(c), hidden, weight, w_logp, w_ent)]
        for c in (False, True)
    )
    # float32 sums over the vocabulary in another order; bf16 gradients within a
    # rounding of each other (and the weight's, a float32 sum of such chunks)
    for a, b in zip(fused, eager):
        assert a.dtype == b.dtype
        if a.dtype == torch.bfloat16:
            scale = float(b.float().abs().max())
            torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=2**-7 * scale)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5)
    assert torch.all(fused[3][[9, 10]] == 0)  # no gradient to the never-sampled rows
    assert torch.all(fused[2][2] == 0) and torch.all(fused[0][~needed] == 0)

    logits = F.linear(hidden, weight).float()
    logits[0, 2, 4] = float("-inf")
    graphs = counters["stats"]["unique_graphs"]
    for length in (7, 5):  # ragged chunks of 4 rows, then a shorter batch
        x = logits[:, :length]

        def alone(compiled, x=x, length=length):
            return lambda lg: token_logprobs_and_entropy(
                lg, ids[:, :length], 0.7, False, 4 * 11, 0, compiled=compiled
            )

        lp, lp2 = (alone(c)(x)[0] for c in (False, True))
        torch.testing.assert_close(lp2, lp, rtol=1e-5, atol=2e-5)
        g, g2 = (
            _grad(alone(c), x, w_logp[:, :length], 0 * w_ent[:, :length]) for c in (False, True)
        )
        torch.testing.assert_close(g2, g, rtol=1e-5, atol=2e-5)
        assert g2[0, 2, 4].item() == 0
        if length == 7:
            graphs = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.gpu
def test_compiled_kernels_hold_no_float32_copy_of_a_chunk():
    """On a GPU the compiled kernels' point is memory traffic, and what shows it is
    memory held: the eager backward holds a chunk's logits in float32 (twice with an
    entropy term), the compiled one only the bf16 logits and their bf16 gradient.
    4,096 tokens in chunks of 512 at a 65,536 vocabulary: one float32 copy of a chunk
    is 128 MiB, and the compiled forward + backward peaks at least that much lower."""
    from rlpost.runtime import device as devices
    from rlpost.trainers.logprobs import hidden_token_stats

    b, t, d, v, chunk = 4, 1024, 256, 65_536, 512
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(b, t, d, generator=g).to("cuda", torch.bfloat16)
    weight = (torch.randn(v, d, generator=g) * d**-0.5).to("cuda", torch.bfloat16)
    ids = torch.randint(0, v, (b, t), generator=g).to("cuda")
    w_logp, w_ent = torch.randn(b, t, device="cuda"), torch.randn(b, t, device="cuda")
    peaks = {}
    for compiled in (False, True, True):  # the first compiled run compiles
        fn = lambda h, w, c=compiled: hidden_token_stats(  # noqa: E731
            h, w, ids, 1.0, True, (), chunk, 0, compiled=c
        )
        devices.synchronize("cuda")
        devices.reset_peak_memory("cuda")
        base = devices.peak_memory_bytes("cuda") or 0
        got = _hidden_grads(fn, hidden, weight, w_logp, w_ent)
        devices.synchronize("cuda")
        peaks[compiled] = (devices.peak_memory_bytes("cuda") or 0) - base
        del got
    assert peaks[True] <= peaks[False] - chunk * v * 4, peaks
