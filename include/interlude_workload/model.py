"""The reference model: a small 2-layer MLP (tanh, softmax) trained with momentum SGD, all numpy.

Deliberately tiny and deterministic: it exists to prove the checkpoint contract (weights, optimizer
state, RNG state and data position restored bit for bit), not to be a good model. Every source of
randomness draws from one ``numpy.random.Generator`` whose ``bit_generator.state`` is checkpointed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

HIDDEN = 32
BATCH = 32
LEARNING_RATE = 0.05
MOMENTUM = 0.9
INPUT_NOISE = 0.05
PARAM_NAMES = ("w1", "b1", "w2", "b2")


@dataclass
class TrainState:
    """Everything a step depends on; together with the data it determines every later step."""

    params: dict[str, np.ndarray]
    velocity: dict[str, np.ndarray]
    rng: np.random.Generator
    order: np.ndarray  # this epoch's permutation of row indices
    position: int  # next row of ``order`` to use
    epoch: int

    def to_checkpoint(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(arrays as a pytree, JSON side): what the SDK saves as Orbax's ``state`` and ``meta`` items."""
        arrays = {"params": dict(self.params), "velocity": dict(self.velocity), "order": self.order}
        meta = {"rng": self.rng.bit_generator.state, "position": self.position, "epoch": self.epoch}
        return arrays, meta

    @classmethod
    def from_checkpoint(cls, arrays: dict[str, Any], meta: dict[str, Any]) -> TrainState:
        bit_generator = getattr(np.random, meta["rng"]["bit_generator"])()
        bit_generator.state = meta["rng"]
        return cls(
            params={k: np.array(arrays["params"][k]) for k in PARAM_NAMES},
            velocity={k: np.array(arrays["velocity"][k]) for k in PARAM_NAMES},
            rng=np.random.Generator(bit_generator),
            order=np.array(arrays["order"]),
            position=int(meta["position"]),
            epoch=int(meta["epoch"]),
        )


def init_params(rng: np.random.Generator, features: int, classes: int) -> dict[str, np.ndarray]:
    return {
        "w1": rng.normal(0.0, 1.0 / np.sqrt(features), size=(features, HIDDEN)),
        "b1": np.zeros(HIDDEN),
        "w2": rng.normal(0.0, 1.0 / np.sqrt(HIDDEN), size=(HIDDEN, classes)),
        "b2": np.zeros(classes),
    }


def new_state(rng: np.random.Generator, params: dict[str, np.ndarray], rows: int) -> TrainState:
    """Fresh optimizer state and data order around given weights (new training or a fine-tune start)."""
    return TrainState(
        params={k: v.copy() for k, v in params.items()},
        velocity={k: np.zeros_like(v) for k, v in params.items()},
        rng=rng,
        order=rng.permutation(rows),
        position=0,
        epoch=0,
    )


def _forward(params: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hidden = np.tanh(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    return hidden, probs


def train_step(state: TrainState, x: np.ndarray, y: np.ndarray) -> float:
    """One momentum-SGD step on the next minibatch; mutates ``state``; returns the batch loss."""
    if state.position + BATCH > len(state.order):
        state.order = state.rng.permutation(len(y))
        state.position = 0
        state.epoch += 1
    idx = state.order[state.position : state.position + BATCH]
    state.position += BATCH
    xb = x[idx] + state.rng.normal(0.0, INPUT_NOISE, size=(len(idx), x.shape[1]))
    yb = y[idx]
    params = state.params
    hidden, probs = _forward(params, xb)
    loss = float(-np.log(probs[np.arange(len(yb)), yb] + 1e-12).mean())
    grad_logits = probs
    grad_logits[np.arange(len(yb)), yb] -= 1.0
    grad_logits /= len(yb)
    grads = {"w2": hidden.T @ grad_logits, "b2": grad_logits.sum(axis=0)}
    grad_hidden = (grad_logits @ params["w2"].T) * (1.0 - hidden**2)
    grads["w1"] = xb.T @ grad_hidden
    grads["b1"] = grad_hidden.sum(axis=0)
    for name in PARAM_NAMES:
        state.velocity[name] = MOMENTUM * state.velocity[name] - LEARNING_RATE * grads[name]
        params[name] = params[name] + state.velocity[name]
    return loss


def accuracy(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float((_forward(params, x)[1].argmax(axis=1) == y).mean())
