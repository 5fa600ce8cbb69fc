"""Gives the order-desk skill its objects: written for CaveAgent, works unchanged here."""

from __future__ import annotations

from dataclasses import dataclass

from cave_agent.runtime import Function, Type, Variable


@dataclass
class Order:
    """One order line."""

    item: str
    quantity: int
    unit_cents: int


def total(orders: list[Order]) -> int:
    """The value of the orders, in cents."""
    return sum(o.quantity * o.unit_cents for o in orders)


pending = [Order("desk", 2, 45_000), Order("lamp", 3, 2_990)]

__exports__ = [
    Function(total, description="value of orders in cents"),
    Variable("pending", pending, "orders waiting to ship"),
    Type(Order),
]
