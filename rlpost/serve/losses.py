"""The Tinker API's loss functions, by the names the SDK sends.

Each takes one datum's ``lp`` -- log p(target_tokens[i] | tokens[..i]) under the
weights being trained, shaped as ``target_tokens`` -- and its ``loss_fn_inputs``,
and returns the loss per token. The datum's loss is their sum and the request's
the sum over its datums: nothing is averaged (weights and advantages carry any
normalisation, as the SDK's documentation says; the cookbook's supervised weights
sum to 1 per example). ``q`` is ``logprobs``, the sampler's log-probs of the same
tokens; ``A`` the ``advantages``; ``r = exp(lp - q)`` the importance ratio.

- ``cross_entropy``: ``-lp * weights``. Targets may be (n,) or (n, k), with
  weights of the same shape.
- ``importance_sampling``: ``-r * A``, the REINFORCE gradient of samples drawn
  from ``q`` (its gradient is ``-r * A * grad lp``).
- ``ppo``: ``-min(r * A, clip(r, lo, hi) * A)`` (Schulman et al., 2017), ``lo``
  and ``hi`` the ratio's bounds (``clip_low_threshold``, ``clip_high_threshold``;
  0.8 and 1.2 unless ``loss_fn_config`` or the datum's inputs set them).
- ``cispo``: ``-sg(clip(r, lo, hi)) * lp * A`` (MiniMax-M1, 2025): the clipped
  ratio is a weight, so every token keeps a gradient.

``dro``, ``gspo`` and ``stable_reinforce`` are names the SDK knows whose exact
definitions (defaults, masking, what is recorded at sampling time) are not in the
SDK or the cookbook: asking for one is an error naming the ones served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from rlpost.serve.errors import UserError

Inputs = Mapping[str, torch.Tensor]
Config = Mapping[str, float | str]
LossFn = Callable[[torch.Tensor, Inputs, Config], torch.Tensor]
CLIP = (0.8, 1.2)  # the ratio's default bounds: 1 -/+ 0.2


def _needs(inputs: Inputs, lp: torch.Tensor, *keys: str) -> list[torch.Tensor]:
    missing = [k for k in keys if k not in inputs]
    if missing:
        raise UserError(f"loss_fn_inputs lacks {', '.join(missing)} (this loss takes "
                        f"target_tokens, {', '.join(keys)})")  # fmt: skip
    out = []
    for key in keys:
        value = inputs[key].to(lp.dtype)
        if value.shape != lp.shape:
            raise UserError(f"loss_fn_inputs[{key!r}] has shape {list(value.shape)}; "
                            f"target_tokens has {list(lp.shape)}")  # fmt: skip
        out.append(value)
    return out


def _bounds(inputs: Inputs, config: Config, lp: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The ratio's bounds: per token from the inputs, else from the config, else 0.8/1.2."""
    out = []
    for key, default in zip(("clip_low_threshold", "clip_high_threshold"), CLIP, strict=True):
        if key in inputs:
            out.append(_needs(inputs, lp, key)[0])
            continue
        value = config.get(key, default)
        if not isinstance(value, (int, float)):
            raise UserError(f"loss_fn_config[{key!r}]={value!r} must be a number")
        out.append(torch.full_like(lp, float(value)))
    low, high = out
    if bool((low > high).any()) or bool((low < 0).any()):
        raise UserError("clip_low_threshold must be >= 0 and at most clip_high_threshold "
                        "(they bound the ratio itself: 0.8 and 1.2 clip it to 1 -/+ 0.2)")  # fmt: skip
    return low, high


def cross_entropy(lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    (weights,) = _needs(inputs, lp, "weights")
    return -lp * weights


def importance_sampling(lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    q, advantages = _needs(inputs, lp, "logprobs", "advantages")
    return -torch.exp(lp - q) * advantages


def ppo(lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    q, advantages = _needs(inputs, lp, "logprobs", "advantages")
    low, high = _bounds(inputs, config, lp)
    ratio = torch.exp(lp - q)
    clipped = torch.minimum(torch.maximum(ratio, low), high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def cispo(lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    q, advantages = _needs(inputs, lp, "logprobs", "advantages")
    low, high = _bounds(inputs, config, lp)
    weight = torch.minimum(torch.maximum(torch.exp(lp - q), low), high).detach()
    return -weight * lp * advantages


LOSSES: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
}
UNDEFINED = ("dro", "gspo", "stable_reinforce", "custom")


def loss_fn(name: str) -> LossFn:
    if name in LOSSES:
        return LOSSES[name]
    why = ("its definition is not established by the SDK and the cookbook"
           if name in UNDEFINED else "not a Tinker loss")  # fmt: skip
    raise UserError(f"loss_fn={name!r}: {why}; this server serves {', '.join(LOSSES)} "
                    "(the cookbook's recipes take loss_fn=importance_sampling)")  # fmt: skip
