"""Tokens and cost per turn and per thread, from the usage each model reply recorded
(`Record.usage`, the provider's own count) and the price setting of its model
(`[llm.prices."<model>"]`: `input_per_mtok`, `output_per_mtok`, optional
`cached_input_per_mtok`, `currency`).

Cached prompt tokens are priced at the cached rate when one is set, else at the input rate.
A reply whose model has no price counts its tokens but no cost, and the turn says so
(`priced` False): a cost is never guessed. The thread's total covers every reply of the log,
earlier branches included (their tokens were spent too); the turns are those of the log in
order.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import msgspec

from datadesk.domain.records import Record
from datadesk.settings import ModelPrice

MTOK = 1_000_000


class TokenCost(msgspec.Struct, kw_only=True):
    """The tokens of some replies and what they cost (None: a reply's model has no price)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost: float | None = 0.0
    currency: str | None = None
    priced: bool = True  # every reply had a price
    models: list[str] = msgspec.field(default_factory=list)

    def add(self, rec: Record, price: ModelPrice | None) -> None:
        u = rec.usage
        if u is None:
            return
        self.requests += 1
        self.prompt_tokens += u.prompt_tokens
        self.completion_tokens += u.completion_tokens
        self.cached_tokens += u.cached_tokens
        if rec.model and rec.model not in self.models:
            self.models.append(rec.model)
        if price is None or (self.currency is not None and price.currency != self.currency):
            self.priced = False  # no price, or two currencies: no sum
            self.cost = None
            return
        self.currency = price.currency
        if self.cost is not None:
            self.cost += reply_cost(u.prompt_tokens, u.cached_tokens, u.completion_tokens, price)


class TurnCost(TokenCost, kw_only=True):
    turn_id: str
    first_seq: int
    last_seq: int  # the turn's last record (the web client puts the figure after it)


def reply_cost(prompt: int, cached: int, completion: int, price: ModelPrice) -> float:
    """The cost of one request: uncached input, cached input and output at their rates."""
    cached = min(max(cached, 0), max(prompt, 0))
    cached_rate = price.input_per_mtok if price.cached_input_per_mtok is None else price.cached_input_per_mtok
    return ((prompt - cached) * price.input_per_mtok + cached * cached_rate
            + completion * price.output_per_mtok) / MTOK


def price_of(model: str | None, prices: Mapping[str, ModelPrice], default_model: str) -> ModelPrice | None:
    return prices.get(model or default_model)


def thread_costs(records: Iterable[Record], prices: Mapping[str, ModelPrice],
                 default_model: str) -> tuple[list[TurnCost], TokenCost]:
    """(the turns with their tokens and cost, in log order; the thread's total)."""
    turns: dict[str, TurnCost] = {}
    total = TokenCost()
    for rec in records:
        if not rec.turn_id:
            continue
        turn = turns.get(rec.turn_id)
        if turn is None:
            turn = turns[rec.turn_id] = TurnCost(turn_id=rec.turn_id, first_seq=rec.seq, last_seq=rec.seq)
        turn.last_seq = max(turn.last_seq, rec.seq)
        if rec.role == "assistant":
            price = price_of(rec.model, prices, default_model)
            turn.add(rec, price)
            total.add(rec, price)
    return [t for t in turns.values() if t.requests], total
